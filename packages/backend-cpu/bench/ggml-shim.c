/*
 * A small C shim over llama.cpp's ggml (the prebuilt CPU libraries of node-llama-cpp 3.21.1:
 * libggml.v0.4.0.so, libggml-base.so and the CPU variant ggml's loader picks for this machine), so
 * that cpu.bench.ts can time llama.cpp's own matrix-vector kernels on the same weight bytes as ours.
 * It mirrors what llama.cpp does with a weight: the CPU backend, the "CPU_REPACK" extra buffer type
 * when ggml says it supports the mul_mat (llama-model.cpp weight_buft_supported), else the plain CPU
 * buffer; one graph of mul_mat nodes; ggml_backend_graph_compute with n threads.
 *
 * Built by cpu.bench.ts with the system C compiler; the declarations below are copied from ggml's
 * headers at that release (llama.cpp tag v0.4.0 in node-llama-cpp's gitRelease.bundle, commit
 * 80fb11ac: ggml/include/ggml.h, ggml-backend.h, ggml-alloc.h), so no header is needed.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- ggml declarations (ggml.h, ggml-backend.h, ggml-alloc.h) ---- */
struct ggml_context;
struct ggml_tensor;
struct ggml_cgraph;
typedef struct ggml_backend_buffer_type *ggml_backend_buffer_type_t;
typedef struct ggml_backend_buffer *ggml_backend_buffer_t;
typedef struct ggml_backend *ggml_backend_t;
typedef struct ggml_backend_reg *ggml_backend_reg_t;
typedef struct ggml_backend_device *ggml_backend_dev_t;
struct ggml_init_params {
  size_t mem_size;
  void *mem_buffer;
  bool no_alloc;
};
enum { GGML_TYPE_F32 = 0, GGML_BACKEND_DEVICE_TYPE_CPU = 0, GGML_DEFAULT_GRAPH_SIZE = 2048 };
struct ggml_context *ggml_init(struct ggml_init_params params);
void ggml_free(struct ggml_context *ctx);
size_t ggml_tensor_overhead(void);
size_t ggml_graph_overhead_custom(size_t size, bool grads);
struct ggml_tensor *ggml_new_tensor_2d(struct ggml_context *ctx, int type, int64_t ne0, int64_t ne1);
struct ggml_tensor *ggml_mul_mat(struct ggml_context *ctx, struct ggml_tensor *a, struct ggml_tensor *b);
struct ggml_cgraph *ggml_new_graph_custom(struct ggml_context *ctx, size_t size, bool grads);
void ggml_build_forward_expand(struct ggml_cgraph *cgraph, struct ggml_tensor *tensor);
size_t ggml_nbytes(const struct ggml_tensor *tensor);
void ggml_backend_load_all_from_path(const char *dir_path);
ggml_backend_dev_t ggml_backend_dev_by_type(int type);
ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char *params);
ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
bool ggml_backend_dev_supports_op(ggml_backend_dev_t device, const struct ggml_tensor *op);
const char *ggml_backend_dev_name(ggml_backend_dev_t device);
const char *ggml_backend_dev_description(ggml_backend_dev_t device);
void *ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char *name);
const char *ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context *ctx, ggml_backend_buffer_type_t buft);
void ggml_backend_buffer_free(ggml_backend_buffer_t buffer);
void ggml_backend_tensor_set(struct ggml_tensor *tensor, const void *data, size_t offset, size_t size);
void ggml_backend_tensor_get(const struct ggml_tensor *tensor, void *data, size_t offset, size_t size);
int ggml_backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph *cgraph);
void ggml_backend_free(ggml_backend_t backend);
typedef void (*ggml_log_callback)(int level, const char *text, void *user_data);
void ggml_log_set(ggml_log_callback log_callback, void *user_data);
typedef ggml_backend_buffer_type_t *(*get_extra_bufts_fn)(ggml_backend_dev_t device);
typedef void (*set_n_threads_fn)(ggml_backend_t backend, int n_threads);

/* ---- the shim ---- */
static ggml_backend_dev_t g_dev;
static ggml_backend_t g_backend;

static void quiet(int level, const char *text, void *user_data) {
  (void)level;
  (void)text;
  (void)user_data;
}

/* Load the CPU backend from `dir` and start it with n_threads (ggml's log silenced). 0 on success. */
int shim_init(const char *dir, int n_threads) {
  if (g_backend) return 0;
  ggml_log_set(quiet, NULL);
  ggml_backend_load_all_from_path(dir);
  g_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  if (!g_dev) return 1;
  g_backend = ggml_backend_dev_init(g_dev, NULL);
  if (!g_backend) return 2;
  set_n_threads_fn set = (set_n_threads_fn)ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(g_dev),
                                                                              "ggml_backend_set_n_threads");
  if (set) set(g_backend, n_threads);
  return 0;
}

const char *shim_device(void) { return g_dev ? ggml_backend_dev_description(g_dev) : ""; }

typedef struct shim {
  struct ggml_context *wctx, *gctx;
  ggml_backend_buffer_t wbuf, gbuf;
  struct ggml_tensor **w, **y, *x;
  struct ggml_cgraph *graph;
  int copies;
  const char *buft;
} shim;

void shim_free(shim *s) {
  if (!s) return;
  if (s->wbuf) ggml_backend_buffer_free(s->wbuf);
  if (s->gbuf) ggml_backend_buffer_free(s->gbuf);
  if (s->wctx) ggml_free(s->wctx);
  if (s->gctx) ggml_free(s->gctx);
  free(s->w);
  free(s->y);
  free(s);
}

/* Weights in `buft`; true when the CPU device runs y = w · x with them there. */
static bool place(shim *s, int type, int64_t k, int64_t n, int64_t m, ggml_backend_buffer_type_t buft) {
  struct ggml_init_params wp = {ggml_tensor_overhead() * (size_t)(s->copies + 1), NULL, true};
  s->wctx = ggml_init(wp);
  for (int c = 0; c < s->copies; c++) s->w[c] = ggml_new_tensor_2d(s->wctx, type, k, n);
  s->wbuf = ggml_backend_alloc_ctx_tensors_from_buft(s->wctx, buft);
  if (!s->wbuf) return false;
  /* probe: a mul_mat node with an f32 x in host memory, as llama.cpp's weight_buft_supported */
  struct ggml_init_params pp = {ggml_tensor_overhead() * 4, NULL, true};
  struct ggml_context *probe = ggml_init(pp);
  struct ggml_tensor *x = ggml_new_tensor_2d(probe, GGML_TYPE_F32, k, m);
  const bool ok = ggml_backend_dev_supports_op(g_dev, ggml_mul_mat(probe, s->w[0], x));
  ggml_free(probe);
  return ok;
}

/*
 * `copies` weights [n, k] of ggml type `type` (ggml's ne = [k, n]), x [m, k] f32, and one graph
 * y_c = w_c · x for every copy. repack: try llama.cpp's extra buffer types first.
 */
shim *shim_new(int type, int64_t k, int64_t n, int copies, int64_t m, int repack) {
  shim *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->copies = copies;
  s->w = calloc((size_t)copies, sizeof *s->w);
  s->y = calloc((size_t)copies, sizeof *s->y);
  bool placed = false;
  if (repack) {
    get_extra_bufts_fn extra = (get_extra_bufts_fn)ggml_backend_reg_get_proc_address(
        ggml_backend_dev_backend_reg(g_dev), "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t *b = extra ? extra(g_dev) : NULL; b && *b && !placed; b++) {
      placed = place(s, type, k, n, m, *b);
      if (placed) s->buft = ggml_backend_buft_name(*b);
      else {
        if (s->wbuf) ggml_backend_buffer_free(s->wbuf);
        if (s->wctx) ggml_free(s->wctx);
        s->wbuf = NULL;
        s->wctx = NULL;
      }
    }
  }
  if (!placed) {
    ggml_backend_buffer_type_t b = ggml_backend_dev_buffer_type(g_dev);
    if (!place(s, type, k, n, m, b)) {
      shim_free(s);
      return NULL;
    }
    s->buft = ggml_backend_buft_name(b);
  }
  struct ggml_init_params gp = {ggml_tensor_overhead() * (size_t)(2 * copies + 4) +
                                    ggml_graph_overhead_custom((size_t)(2 * copies + 4), false),
                                NULL, true};
  s->gctx = ggml_init(gp);
  s->x = ggml_new_tensor_2d(s->gctx, GGML_TYPE_F32, k, m);
  s->graph = ggml_new_graph_custom(s->gctx, (size_t)(2 * copies + 4), false);
  for (int c = 0; c < copies; c++) {
    s->y[c] = ggml_mul_mat(s->gctx, s->w[c], s->x);
    ggml_build_forward_expand(s->graph, s->y[c]);
  }
  s->gbuf = ggml_backend_alloc_ctx_tensors_from_buft(s->gctx, ggml_backend_dev_buffer_type(g_dev));
  if (!s->gbuf) {
    shim_free(s);
    return NULL;
  }
  return s;
}

const char *shim_buft(shim *s) { return s->buft; }

/* Copy `bytes` of weight c in (repacked on the way when its buffer type says so). */
void shim_set_weight(shim *s, int c, const void *data, size_t bytes) { ggml_backend_tensor_set(s->w[c], data, 0, bytes); }
void shim_set_x(shim *s, const float *x, size_t bytes) { ggml_backend_tensor_set(s->x, x, 0, bytes); }
void shim_get_y(shim *s, int c, float *y, size_t bytes) { ggml_backend_tensor_get(s->y[c], y, 0, bytes); }

/* Run the graph: every y_c = w_c · x. Returns the ggml status (0 = success). */
int shim_compute(shim *s) { return ggml_backend_graph_compute(g_backend, s->graph); }

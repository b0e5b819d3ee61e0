/*
 * tp_vk.h — the C ABI of libtp_vulkan.so, the thin shim of @tp/backend-vulkan over the Vulkan loader.
 *
 * The loader (libvulkan.so.1) is opened at run time with dlopen, so the library builds and loads on a
 * machine without Vulkan; only tp_vk_create fails there, with a message that names what is missing.
 *
 * Conventions (../shared/STYLE.md §4):
 * - Every call that can fail returns a tp_vk_status; the message of the last failure on a context is
 *   tp_vk_error(ctx). tp_vk_create, which has no context yet, writes its message into a caller buffer.
 * - No global state: everything lives in a tp_vk_ctx (the loader handle, the instance, the device, the
 *   command batches). Contexts are not thread-safe: one thread uses a context at a time.
 * - Ownership: the caller owns every host pointer it passes and keeps it only for the call. Buffers and
 *   pipelines belong to their context; tp_vk_destroy frees whatever is left.
 * - Sizes and offsets are bytes (uint64_t); element counts are never used here (kernels get them in
 *   their push constants).
 *
 * Work model: tp_vk_dispatch / tp_vk_buffer_copy / tp_vk_buffer_fill record into the current command
 * buffer with a compute-to-compute barrier after each command; nothing runs until tp_vk_submit (or a
 * full batch, or a wait). tp_vk_wait submits and waits for everything. Buffer reads and writes wait for
 * the work that uses the buffer, so they always see (and never disturb) the ops recorded before them.
 * Destroying a buffer that queued work still uses is deferred until that work has finished.
 */
#ifndef TP_VK_H
#define TP_VK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TP_VK_API __attribute__((visibility("default")))
#else
#define TP_VK_API
#endif

/** Bumped on every change of a signature or struct below; @tp/backend-vulkan refuses other versions. */
#define TP_VK_ABI_VERSION 4

/** Status codes. */
typedef enum {
  TP_VK_OK = 0,
  TP_VK_ERR_ARG = 1,         /* a bad argument (null handle, out-of-range offset, wrong count) */
  TP_VK_ERR_OOM = 2,         /* device or host memory exhausted, or past a device limit */
  TP_VK_ERR_UNSUPPORTED = 3, /* no loader, no device, a missing feature or extension */
  TP_VK_ERR_INTERNAL = 4,    /* a Vulkan call failed unexpectedly (device lost, ...) */
} tp_vk_status;

/** Flags of tp_vk_create. */
#define TP_VK_VERBOSE 1u       /* print the chosen device and its limits on stderr */
#define TP_VK_VALIDATION 2u    /* enable VK_LAYER_KHRONOS_validation when installed (debugging) */
#define TP_VK_FORCE_STAGING 4u /* never map device memory: copy through a staging buffer (tests) */

/** Bits of tp_vk_device_info.features. */
#define TP_VK_FEATURE_FLOAT16 1u      /* shaderFloat16 */
#define TP_VK_FEATURE_INT8 2u         /* shaderInt8 */
#define TP_VK_FEATURE_STORAGE16 4u    /* storageBuffer16BitAccess */
#define TP_VK_FEATURE_STORAGE8 8u     /* storageBuffer8BitAccess */
#define TP_VK_FEATURE_FLOAT64 16u     /* shaderFloat64 */
#define TP_VK_FEATURE_INT64 32u       /* shaderInt64 */
#define TP_VK_FEATURE_TIMESTAMPS 64u  /* timestamps on the compute queue */
#define TP_VK_FEATURE_SUBGROUP 128u   /* subgroup basic + arithmetic + shuffle in compute shaders */

/** Device types (VkPhysicalDeviceType). */
#define TP_VK_DEVICE_OTHER 0
#define TP_VK_DEVICE_INTEGRATED 1
#define TP_VK_DEVICE_DISCRETE 2
#define TP_VK_DEVICE_VIRTUAL 3
#define TP_VK_DEVICE_CPU 4

/**
 * What tp_vk_info reports about the chosen device. Plain uint64_t fields then two strings, so that the
 * layout is the same for every compiler; struct_bytes is sizeof(tp_vk_device_info).
 */
typedef struct {
  uint64_t struct_bytes;
  uint64_t device_index;                 /* index among the physical devices */
  uint64_t device_count;                 /* physical devices the loader reports */
  uint64_t device_type;                  /* TP_VK_DEVICE_* */
  uint64_t api_version;                  /* VK_MAKE_API_VERSION packed */
  uint64_t driver_version;
  uint64_t vendor_id;
  uint64_t device_id;
  uint64_t max_storage_buffer_range;     /* bytes one storage-buffer binding may span */
  uint64_t max_memory_allocation_size;   /* bytes of one allocation */
  uint64_t min_storage_buffer_offset_alignment;
  uint64_t max_compute_shared_memory;    /* bytes */
  uint64_t max_workgroup_invocations;
  uint64_t max_workgroup_size[3];
  uint64_t max_workgroup_count[3];
  uint64_t max_push_constants;           /* bytes */
  uint64_t subgroup_size;
  uint64_t device_local_bytes;           /* sum of the device-local heaps */
  uint64_t unified_memory;               /* 1 when buffers are mapped directly (no staging) */
  uint64_t features;                     /* TP_VK_FEATURE_* bits */
  uint64_t timestamp_period_fs;          /* femtoseconds per timestamp tick (0: none) */
  char name[256];                        /* VkPhysicalDeviceProperties.deviceName */
  char driver[256];                      /* driver name and info, when the device reports them */
} tp_vk_device_info;

typedef struct tp_vk_ctx tp_vk_ctx;
typedef struct tp_vk_buffer tp_vk_buffer;
typedef struct tp_vk_pipeline tp_vk_pipeline;

/** TP_VK_ABI_VERSION of the built library. */
TP_VK_API int32_t tp_vk_abi_version(void);

/**
 * Open the loader, create an instance, choose a device and create a context on it.
 * @param loader       path or soname of the Vulkan loader; NULL for "libvulkan.so.1"
 * @param device_index index of the physical device, or -1 to choose (discrete, integrated, virtual,
 *                     then CPU devices; the first of the best type)
 * @param device_name  when not NULL and device_index is -1: the first device whose name contains it
 * @param flags        TP_VK_VERBOSE | TP_VK_VALIDATION | TP_VK_FORCE_STAGING
 * @param out          receives the context
 * @param err          receives a NUL-terminated message on failure (may be NULL)
 * @param err_bytes    size of err
 * @return TP_VK_ERR_UNSUPPORTED when there is no loader, no Vulkan 1.1 device, no compute queue or no
 *         device matching index / name; TP_VK_ERR_ARG for a bad argument; TP_VK_ERR_INTERNAL
 */
TP_VK_API int32_t tp_vk_create(const char *loader, int32_t device_index, const char *device_name,
                               uint32_t flags, tp_vk_ctx **out, char *err, uint64_t err_bytes);

/** Wait for all work, free every buffer and pipeline, the device, the instance and the loader. NULL is ignored. */
TP_VK_API void tp_vk_destroy(tp_vk_ctx *ctx);

/** The message of the last failed call on ctx ("" when none). Valid until the next call on ctx. */
TP_VK_API const char *tp_vk_error(const tp_vk_ctx *ctx);

/** Fill *out (out_bytes must be sizeof(tp_vk_device_info)). */
TP_VK_API int32_t tp_vk_info(const tp_vk_ctx *ctx, tp_vk_device_info *out, uint64_t out_bytes);

/**
 * A storage buffer of `bytes` (> 0, ≤ max_memory_allocation_size), rounded up to 16 bytes. Its contents
 * are undefined until written.
 * @return TP_VK_ERR_OOM past the device's limits or when the device is out of memory (the message names
 *         the device, the size and the limit)
 */
TP_VK_API int32_t tp_vk_buffer_create(tp_vk_ctx *ctx, uint64_t bytes, tp_vk_buffer **out);

/**
 * A host-visible, host-coherent buffer of `bytes` (> 0), mapped: a staging buffer of the caller's
 * (writes are a memcpy after the work that uses it; tp_vk_buffer_copy moves its bytes to a device
 * buffer on the queue). Host memory on a discrete GPU; the same memory as other buffers where the
 * device's memory is unified. Limits and errors as tp_vk_buffer_create.
 */
TP_VK_API int32_t tp_vk_buffer_create_host(tp_vk_ctx *ctx, uint64_t bytes, tp_vk_buffer **out);

/** Free a buffer; when queued work still uses it, the memory is freed once that work is done. */
TP_VK_API int32_t tp_vk_buffer_destroy(tp_vk_ctx *ctx, tp_vk_buffer *buffer);

/** Size of a buffer in bytes as created (before rounding). */
TP_VK_API uint64_t tp_vk_buffer_size(const tp_vk_buffer *buffer);

/**
 * Copy `bytes` host bytes into the buffer at `offset`, after the queued work that uses the buffer.
 * @return TP_VK_ERR_ARG when [offset, offset + bytes) is not inside the buffer
 */
TP_VK_API int32_t tp_vk_buffer_write(tp_vk_ctx *ctx, tp_vk_buffer *buffer, uint64_t offset, const void *src,
                                     uint64_t bytes);

/**
 * Copy `bytes` from the buffer at `offset` to host memory, after all queued work (it is submitted and
 * waited for). @return TP_VK_ERR_ARG when the range is not inside the buffer
 */
TP_VK_API int32_t tp_vk_buffer_read(tp_vk_ctx *ctx, tp_vk_buffer *buffer, uint64_t offset, void *dst,
                                    uint64_t bytes);

/** Record a copy of `bytes` between two buffers (ranges checked; they must not overlap in one buffer). */
TP_VK_API int32_t tp_vk_buffer_copy(tp_vk_ctx *ctx, tp_vk_buffer *src, uint64_t src_offset, tp_vk_buffer *dst,
                                    uint64_t dst_offset, uint64_t bytes);

/** Record a fill of `bytes` at `offset` with the 32-bit word `value` (offset and bytes multiples of 4). */
TP_VK_API int32_t tp_vk_buffer_fill(tp_vk_ctx *ctx, tp_vk_buffer *buffer, uint64_t offset, uint64_t bytes,
                                    uint32_t value);

/**
 * A compute pipeline from SPIR-V (entry point "main") with `n_buffers` storage-buffer bindings
 * (set 0, bindings 0..n_buffers-1), `push_bytes` of push constants and specialization constants
 * 0..n_spec-1 (uint32 each; constant_id 0..2 are usually the local size).
 * @return TP_VK_ERR_ARG for a bad size or count; TP_VK_ERR_UNSUPPORTED when the device rejects the
 *         module (a capability it lacks)
 */
TP_VK_API int32_t tp_vk_pipeline_create(tp_vk_ctx *ctx, const void *spirv, uint64_t spirv_bytes, uint32_t n_buffers,
                                        uint32_t push_bytes, const uint32_t *spec, uint32_t n_spec,
                                        tp_vk_pipeline **out);

/**
 * Record one dispatch. `bindings` holds n_buffers triples {buffer pointer, offset, range} as uint64_t
 * (offset a multiple of min_storage_buffer_offset_alignment, range ≤ max_storage_buffer_range and inside
 * the buffer); `push` holds the pipeline's push_bytes (may be NULL when it has none).
 * @return TP_VK_ERR_ARG for a binding outside its buffer, a misaligned offset, a range past the device
 *         limit, or group counts past max_workgroup_count
 */
TP_VK_API int32_t tp_vk_dispatch(tp_vk_ctx *ctx, tp_vk_pipeline *pipeline, const uint64_t *bindings,
                                 uint32_t n_bindings, const void *push, uint32_t push_bytes, uint32_t groups_x,
                                 uint32_t groups_y, uint32_t groups_z);

/** Submit what was recorded, without waiting. */
TP_VK_API int32_t tp_vk_submit(tp_vk_ctx *ctx);

/** Submit what was recorded and wait until every submitted batch has finished. */
TP_VK_API int32_t tp_vk_wait(tp_vk_ctx *ctx);

/**
 * Counters: out[0] dispatches recorded, out[1] batches submitted, out[2] waits, out[3] live buffers,
 * out[4] bytes of live buffers, out[5] buffers whose destruction waits for queued work, out[6]
 * nanoseconds of GPU time of the dispatches of the last waited batches (0 without timestamps).
 * @param n number of entries of out (at most 7 are written)
 */
TP_VK_API int32_t tp_vk_stats(const tp_vk_ctx *ctx, uint64_t *out, uint32_t n);

/**
 * Turn GPU timing on or off: timestamps around each batch (tp_vk_stats out[6]) and around each
 * command, credited per pipeline (tp_vk_pipeline_stats). Turning it on or off resets both.
 * @return TP_VK_ERR_UNSUPPORTED when the device has no timestamps on its compute queue
 */
TP_VK_API int32_t tp_vk_profile(tp_vk_ctx *ctx, int32_t enable);

/**
 * GPU time of one pipeline since profiling was turned on: out[0] dispatches timed, out[1] their
 * nanoseconds (each from the end of the command before to the end of this one; batches waited for).
 * @param n number of entries of out (at most 2 are written)
 */
TP_VK_API int32_t tp_vk_pipeline_stats(const tp_vk_ctx *ctx, const tp_vk_pipeline *pipeline, uint64_t *out,
                                       uint32_t n);

/**
 * The device memory the buffers come from, as the device reports it: out[0] 1 when VK_EXT_memory_budget
 * is enabled (else 0 and out[1], out[2] are 0), out[1] the heaps' budget (bytes this process may use in
 * all, VkPhysicalDeviceMemoryBudgetPropertiesEXT.heapBudget), out[2] their usage by this process
 * (heapUsage), out[3] the heaps' size. Sums over the heaps of the buffers' memory types.
 * @param n number of entries of out (at most 4 are written)
 */
TP_VK_API int32_t tp_vk_memory_budget(tp_vk_ctx *ctx, uint64_t *out, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif

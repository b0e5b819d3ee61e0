/*
 * Internals of libtp_vulkan.so shared by context.c (loader, instance, device), memory.c (buffers,
 * staging) and commands.c (pipelines, batches, synchronisation). Not part of the ABI.
 *
 * Vulkan functions come from the loader through vkGetInstanceProcAddr / vkGetDeviceProcAddr into the
 * table of the context (VK_NO_PROTOTYPES: the library never links against libvulkan).
 */
#ifndef TP_VK_INTERNAL_H
#define TP_VK_INTERNAL_H

#define VK_NO_PROTOTYPES
#include <stdarg.h>
#include <stddef.h>
#include <vulkan/vulkan.h>

#include "tp_vk.h"

/* Functions of the instance level (looked up with the instance). */
#define TP_VK_INSTANCE_FUNCTIONS(X)         \
  X(vkDestroyInstance)                      \
  X(vkEnumeratePhysicalDevices)             \
  X(vkGetPhysicalDeviceProperties)          \
  X(vkGetPhysicalDeviceProperties2)         \
  X(vkGetPhysicalDeviceFeatures)            \
  X(vkGetPhysicalDeviceFeatures2)           \
  X(vkGetPhysicalDeviceMemoryProperties)    \
  X(vkGetPhysicalDeviceMemoryProperties2)   \
  X(vkEnumerateDeviceExtensionProperties)   \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkCreateDevice)                         \
  X(vkGetDeviceProcAddr)

/* Functions of the device level (looked up with the device). */
#define TP_VK_DEVICE_FUNCTIONS(X)      \
  X(vkDestroyDevice)                   \
  X(vkGetDeviceQueue)                  \
  X(vkDeviceWaitIdle)                  \
  X(vkCreateBuffer)                    \
  X(vkDestroyBuffer)                   \
  X(vkGetBufferMemoryRequirements)     \
  X(vkAllocateMemory)                  \
  X(vkFreeMemory)                      \
  X(vkBindBufferMemory)                \
  X(vkMapMemory)                       \
  X(vkUnmapMemory)                     \
  X(vkInvalidateMappedMemoryRanges)    \
  X(vkFlushMappedMemoryRanges)         \
  X(vkCreateShaderModule)              \
  X(vkDestroyShaderModule)             \
  X(vkCreateDescriptorSetLayout)       \
  X(vkDestroyDescriptorSetLayout)      \
  X(vkCreatePipelineLayout)            \
  X(vkDestroyPipelineLayout)           \
  X(vkCreateComputePipelines)          \
  X(vkDestroyPipeline)                 \
  X(vkCreateDescriptorPool)            \
  X(vkDestroyDescriptorPool)           \
  X(vkResetDescriptorPool)             \
  X(vkAllocateDescriptorSets)          \
  X(vkUpdateDescriptorSets)            \
  X(vkCreateCommandPool)               \
  X(vkDestroyCommandPool)              \
  X(vkAllocateCommandBuffers)          \
  X(vkResetCommandBuffer)              \
  X(vkBeginCommandBuffer)              \
  X(vkEndCommandBuffer)                \
  X(vkCmdBindPipeline)                 \
  X(vkCmdBindDescriptorSets)           \
  X(vkCmdPushConstants)                \
  X(vkCmdDispatch)                     \
  X(vkCmdPipelineBarrier)              \
  X(vkCmdCopyBuffer)                   \
  X(vkCmdFillBuffer)                   \
  X(vkCmdResetQueryPool)               \
  X(vkCmdWriteTimestamp)               \
  X(vkCreateQueryPool)                 \
  X(vkDestroyQueryPool)                \
  X(vkGetQueryPoolResults)             \
  X(vkCreateFence)                     \
  X(vkDestroyFence)                    \
  X(vkResetFences)                     \
  X(vkWaitForFences)                   \
  X(vkQueueSubmit)

typedef struct {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
  PFN_vkCreateInstance vkCreateInstance;
  PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion; /* NULL on a Vulkan 1.0 loader */
  PFN_vkEnumerateInstanceLayerProperties vkEnumerateInstanceLayerProperties;
#define TP_VK_DECLARE(name) PFN_##name name;
  TP_VK_INSTANCE_FUNCTIONS(TP_VK_DECLARE)
  TP_VK_DEVICE_FUNCTIONS(TP_VK_DECLARE)
#undef TP_VK_DECLARE
} tp_vk_functions;

/** Commands recorded into one batch before it is submitted on its own. */
#define TP_VK_BATCH_COMMANDS 512u
/** Storage-buffer bindings one pipeline may have. */
#define TP_VK_MAX_BINDINGS 8u
/** Batches in flight at once: one records while the other runs. */
#define TP_VK_FRAMES 2u
/** Bytes of the staging buffer (transfers of larger ranges go through it in pieces). */
#define TP_VK_STAGING_BYTES (32ull << 20)

/** Timestamps of one batch: its begin and end, then a (before, after) pair per command. */
#define TP_VK_BATCH_QUERIES (2u + 2u * TP_VK_BATCH_COMMANDS)

/** One batch: a command buffer, its descriptor pool, its fence and its timestamps. */
typedef struct {
  VkCommandBuffer cmd;
  VkFence fence;
  VkDescriptorPool pool;
  VkQueryPool queries; /* TP_VK_BATCH_QUERIES timestamps, or VK_NULL_HANDLE */
  uint32_t commands;   /* recorded into cmd */
  struct tp_vk_pipeline *timed_pipes[TP_VK_BATCH_COMMANDS]; /* per command while profiling: its pipeline, or
                                                                NULL for a copy / fill (not attributed) */
  int recording;       /* cmd is between begin and end */
  int in_flight;       /* submitted, fence not yet waited */
  int timed;           /* the begin timestamp was written */
  uint64_t serial;     /* batch number while recording / in flight */
} tp_vk_frame;

struct tp_vk_buffer {
  VkBuffer buffer;
  VkDeviceMemory memory;
  uint64_t size;       /* bytes asked for */
  uint64_t alloc_size; /* bytes of the VkBuffer (size rounded up) */
  void *mapped;        /* persistent mapping of unified memory, or NULL */
  uint64_t last_use;   /* serial of the last batch that uses it (0: none) */
  int dead;            /* destroyed by the caller, waiting for its last batch */
  struct tp_vk_buffer *prev, *next; /* the context's list of buffers */
};

struct tp_vk_pipeline {
  VkShaderModule module;
  VkDescriptorSetLayout set_layout;
  VkPipelineLayout layout;
  VkPipeline pipeline;
  uint32_t n_buffers;
  uint32_t push_bytes;
  uint64_t timed_dispatches; /* dispatches timed while profiling (tp_vk_pipeline_stats) */
  uint64_t gpu_ns;           /* their GPU time */
  struct tp_vk_pipeline *next; /* the context's list of pipelines */
};

struct tp_vk_ctx {
  void *loader; /* dlopen handle of libvulkan */
  tp_vk_functions vk;
  VkInstance instance;
  VkPhysicalDevice physical;
  VkDevice device;
  VkQueue queue;
  uint32_t queue_family;
  uint32_t flags;
  tp_vk_device_info info;
  VkPhysicalDeviceMemoryProperties memory;
  uint32_t buffer_type_bits;  /* memory types buffers may use (unified or device-local) */
  uint32_t staging_type_bits; /* host-visible coherent types for staging */
  int coherent;               /* unified memory is host-coherent */
  int memory_budget_ext;      /* VK_EXT_memory_budget is enabled on the device */

  VkCommandPool command_pool;
  tp_vk_frame frames[TP_VK_FRAMES];
  uint32_t current;        /* index of the frame that records */
  uint64_t next_serial;    /* serial of the next batch that starts recording */
  uint64_t done_serial;    /* every batch up to this serial has finished */
  int profile;             /* write timestamps around batches */

  tp_vk_buffer *buffers;   /* every live or dead-but-pending buffer */
  tp_vk_pipeline *pipelines;
  tp_vk_buffer *staging;   /* lazily created when memory is not unified */

  uint64_t stat_dispatches, stat_batches, stat_waits, stat_live, stat_live_bytes, stat_pending;
  uint64_t stat_gpu_ns;

  char error[1024];
};

/* context.c */
int tp_vk_fail(tp_vk_ctx *ctx, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int tp_vk_check(tp_vk_ctx *ctx, VkResult r, const char *what);
const char *tp_vk_result_name(VkResult r);

/* memory.c */
int tp_vk_memory_init(tp_vk_ctx *ctx);
void tp_vk_buffer_free_now(tp_vk_ctx *ctx, tp_vk_buffer *b);
void tp_vk_sweep(tp_vk_ctx *ctx);

/* commands.c */
int tp_vk_commands_init(tp_vk_ctx *ctx);
void tp_vk_commands_destroy(tp_vk_ctx *ctx);
int tp_vk_record_begin(tp_vk_ctx *ctx, tp_vk_frame **out);
void tp_vk_record_begin_command(tp_vk_ctx *ctx, tp_vk_frame *f, struct tp_vk_pipeline *p);
void tp_vk_record_end_command(tp_vk_ctx *ctx, tp_vk_frame *f);
int tp_vk_wait_serial(tp_vk_ctx *ctx, uint64_t serial);

#endif

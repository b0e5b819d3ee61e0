/*
 * Buffers of libtp_vulkan.so: one VkBuffer with its own allocation per buffer (storage + transfer
 * usage). Where the device's memory is host-visible (integrated GPUs, llvmpipe, resizable-BAR heaps
 * as large as the device-local heap) buffers are mapped once and read / written with memcpy; elsewhere
 * (discrete GPUs) reads and writes go through a host-visible staging buffer of TP_VK_STAGING_BYTES, in
 * pieces. Both wait for the queued work that uses the buffer first.
 *
 * Source: Vulkan 1.3 specification §12.7 (Buffers), §11.2 (Device Memory: memory types, mapping,
 * vkInvalidateMappedMemoryRanges for non-coherent memory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Pick memory types: the buffers' (unified when a host-visible device-local type is as large as the
 * device-local heap and staging is not forced) and the staging buffer's. */
int tp_vk_memory_init(tp_vk_ctx *ctx) {
  ctx->vk.vkGetPhysicalDeviceMemoryProperties(ctx->physical, &ctx->memory);
  const VkPhysicalDeviceMemoryProperties *m = &ctx->memory;
  uint64_t largest_local = 0;
  for (uint32_t h = 0; h < m->memoryHeapCount; h++)
    if (m->memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      ctx->info.device_local_bytes += m->memoryHeaps[h].size;
      if (m->memoryHeaps[h].size > largest_local) largest_local = m->memoryHeaps[h].size;
    }
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  uint32_t unified = 0, local = 0, staging = 0;
  for (uint32_t t = 0; t < m->memoryTypeCount; t++) {
    VkMemoryPropertyFlags f = m->memoryTypes[t].propertyFlags;
    uint64_t heap = m->memoryHeaps[m->memoryTypes[t].heapIndex].size;
    if (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) {
      local |= 1u << t;
      if ((f & host) == host && heap * 10 >= largest_local * 9) unified |= 1u << t;
    }
    if ((f & host) == host) staging |= 1u << t;
  }
  if (local == 0) {
    /* Some CPU implementations expose no device-local type: host-visible memory is the device's. */
    for (uint32_t t = 0; t < m->memoryTypeCount; t++)
      if ((m->memoryTypes[t].propertyFlags & host) == host) unified |= 1u << t, local |= 1u << t;
    for (uint32_t h = 0; h < m->memoryHeapCount; h++) ctx->info.device_local_bytes += m->memoryHeaps[h].size;
  }
  if (staging == 0)
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "Vulkan device %s has no host-visible coherent memory",
                      ctx->info.name);
  if (unified && !(ctx->flags & TP_VK_FORCE_STAGING)) {
    ctx->buffer_type_bits = unified;
    ctx->info.unified_memory = 1;
    ctx->coherent = 1;
  } else {
    ctx->buffer_type_bits = local;
  }
  ctx->staging_type_bits = staging;
  return TP_VK_OK;
}

/* The first memory type allowed by `bits` (ours) and `req` (the buffer's). */
static int memory_type(const tp_vk_ctx *ctx, uint32_t bits, uint32_t req) {
  for (uint32_t t = 0; t < ctx->memory.memoryTypeCount; t++)
    if ((bits & req) & (1u << t)) return (int)t;
  return -1;
}

static int create(tp_vk_ctx *ctx, uint64_t bytes, uint32_t type_bits, int map, tp_vk_buffer **out) {
  *out = NULL;
  const tp_vk_device_info *info = &ctx->info;
  if (bytes == 0) return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_buffer_create: 0 bytes");
  uint64_t alloc = (bytes + 15) & ~(uint64_t)15;
  if (alloc < bytes || alloc > info->max_memory_allocation_size)
    return tp_vk_fail(ctx, TP_VK_ERR_OOM,
                      "a buffer of %llu bytes is past the largest allocation of Vulkan device %s "
                      "(maxMemoryAllocationSize %llu bytes)",
                      (unsigned long long)bytes, info->name, (unsigned long long)info->max_memory_allocation_size);
  if (alloc > info->device_local_bytes)
    return tp_vk_fail(ctx, TP_VK_ERR_OOM, "a buffer of %llu bytes is more than the %llu bytes of Vulkan device %s",
                      (unsigned long long)bytes, (unsigned long long)info->device_local_bytes, info->name);
  tp_vk_buffer *b = calloc(1, sizeof *b);
  if (b == NULL) return tp_vk_fail(ctx, TP_VK_ERR_OOM, "tp_vk_buffer_create: out of host memory");
  b->size = bytes;
  b->alloc_size = alloc;
  VkBufferCreateInfo bci = {
      .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
      .size = alloc,
      .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
      .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
  };
  VkResult r = ctx->vk.vkCreateBuffer(ctx->device, &bci, NULL, &b->buffer);
  if (r != VK_SUCCESS) {
    free(b);
    return tp_vk_check(ctx, r, "vkCreateBuffer");
  }
  VkMemoryRequirements req;
  ctx->vk.vkGetBufferMemoryRequirements(ctx->device, b->buffer, &req);
  int type = memory_type(ctx, type_bits, req.memoryTypeBits);
  if (type < 0) {
    ctx->vk.vkDestroyBuffer(ctx->device, b->buffer, NULL);
    free(b);
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "Vulkan device %s offers no memory type for a storage buffer",
                      info->name);
  }
  VkMemoryAllocateInfo mai = {
      .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
      .allocationSize = req.size,
      .memoryTypeIndex = (uint32_t)type,
  };
  r = ctx->vk.vkAllocateMemory(ctx->device, &mai, NULL, &b->memory);
  if (r == VK_SUCCESS) r = ctx->vk.vkBindBufferMemory(ctx->device, b->buffer, b->memory, 0);
  if (r == VK_SUCCESS && map) r = ctx->vk.vkMapMemory(ctx->device, b->memory, 0, VK_WHOLE_SIZE, 0, &b->mapped);
  if (r != VK_SUCCESS) {
    int s = tp_vk_check(ctx, r, "allocating a buffer");
    if (s == TP_VK_ERR_OOM)
      tp_vk_fail(ctx, s, "Vulkan device %s is out of memory for a buffer of %llu bytes (%s)", info->name,
                 (unsigned long long)bytes, tp_vk_result_name(r));
    if (b->memory) ctx->vk.vkFreeMemory(ctx->device, b->memory, NULL);
    ctx->vk.vkDestroyBuffer(ctx->device, b->buffer, NULL);
    free(b);
    return s;
  }
  b->next = ctx->buffers;
  if (ctx->buffers) ctx->buffers->prev = b;
  ctx->buffers = b;
  ctx->stat_live++;
  ctx->stat_live_bytes += bytes;
  *out = b;
  return TP_VK_OK;
}

int32_t tp_vk_buffer_create(tp_vk_ctx *ctx, uint64_t bytes, tp_vk_buffer **out) {
  if (ctx == NULL || out == NULL) return TP_VK_ERR_ARG;
  return create(ctx, bytes, ctx->buffer_type_bits, ctx->info.unified_memory != 0, out);
}

int32_t tp_vk_buffer_create_host(tp_vk_ctx *ctx, uint64_t bytes, tp_vk_buffer **out) {
  if (ctx == NULL || out == NULL) return TP_VK_ERR_ARG;
  return create(ctx, bytes, ctx->staging_type_bits, 1, out);
}

uint64_t tp_vk_buffer_size(const tp_vk_buffer *b) { return b ? b->size : 0; }

void tp_vk_buffer_free_now(tp_vk_ctx *ctx, tp_vk_buffer *b) {
  if (b->prev) b->prev->next = b->next;
  else ctx->buffers = b->next;
  if (b->next) b->next->prev = b->prev;
  if (b->mapped) ctx->vk.vkUnmapMemory(ctx->device, b->memory);
  ctx->vk.vkDestroyBuffer(ctx->device, b->buffer, NULL);
  ctx->vk.vkFreeMemory(ctx->device, b->memory, NULL);
  if (b->dead) ctx->stat_pending--;
  else {
    ctx->stat_live--;
    ctx->stat_live_bytes -= b->size;
  }
  free(b);
}

/* Free the buffers whose last batch has finished. */
void tp_vk_sweep(tp_vk_ctx *ctx) {
  tp_vk_buffer *b = ctx->buffers;
  while (b) {
    tp_vk_buffer *next = b->next;
    if (b->dead && b->last_use <= ctx->done_serial) tp_vk_buffer_free_now(ctx, b);
    b = next;
  }
}

int32_t tp_vk_buffer_destroy(tp_vk_ctx *ctx, tp_vk_buffer *b) {
  if (ctx == NULL || b == NULL) return TP_VK_ERR_ARG;
  if (b->dead) return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_buffer_destroy: buffer destroyed twice");
  if (b->last_use > ctx->done_serial) {
    b->dead = 1;
    ctx->stat_live--;
    ctx->stat_live_bytes -= b->size;
    ctx->stat_pending++;
    return TP_VK_OK;
  }
  tp_vk_buffer_free_now(ctx, b);
  return TP_VK_OK;
}

static int check_range(tp_vk_ctx *ctx, const char *fn, const tp_vk_buffer *b, uint64_t offset, uint64_t bytes) {
  if (b == NULL) return tp_vk_fail(ctx, TP_VK_ERR_ARG, "%s: buffer is NULL", fn);
  if (b->dead) return tp_vk_fail(ctx, TP_VK_ERR_ARG, "%s: buffer was destroyed", fn);
  if (offset > b->size || bytes > b->size - offset)
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "%s: bytes [%llu, %llu) are outside a buffer of %llu bytes", fn,
                      (unsigned long long)offset, (unsigned long long)(offset + bytes), (unsigned long long)b->size);
  return TP_VK_OK;
}

static int staging(tp_vk_ctx *ctx) {
  if (ctx->staging) return TP_VK_OK;
  uint64_t bytes = TP_VK_STAGING_BYTES;
  if (bytes > ctx->info.max_memory_allocation_size) bytes = ctx->info.max_memory_allocation_size & ~(uint64_t)15;
  int s = create(ctx, bytes, ctx->staging_type_bits, 1, &ctx->staging);
  if (s == TP_VK_OK) {
    ctx->stat_live--; /* internal: not counted as a caller's buffer */
    ctx->stat_live_bytes -= bytes;
  }
  return s;
}

/* Record a copy and submit + wait (transfers through the staging buffer). */
static int copy_now(tp_vk_ctx *ctx, tp_vk_buffer *src, uint64_t so, tp_vk_buffer *dst, uint64_t d0, uint64_t n) {
  int s = tp_vk_buffer_copy(ctx, src, so, dst, d0, n);
  if (s == TP_VK_OK) s = tp_vk_wait(ctx);
  return s;
}

int32_t tp_vk_buffer_write(tp_vk_ctx *ctx, tp_vk_buffer *b, uint64_t offset, const void *src, uint64_t bytes) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  int s = check_range(ctx, "tp_vk_buffer_write", b, offset, bytes);
  if (s != TP_VK_OK || bytes == 0) return s;
  if (src == NULL) return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_buffer_write: src is NULL");
  if ((s = tp_vk_wait_serial(ctx, b->last_use)) != TP_VK_OK) return s;
  if (b->mapped) {
    memcpy((char *)b->mapped + offset, src, bytes);
    return TP_VK_OK;
  }
  if ((s = staging(ctx)) != TP_VK_OK) return s;
  /* The staging buffer is free once everything submitted has finished. */
  if ((s = tp_vk_wait(ctx)) != TP_VK_OK) return s;
  for (uint64_t done = 0; done < bytes;) {
    uint64_t n = bytes - done < ctx->staging->size ? bytes - done : ctx->staging->size;
    memcpy(ctx->staging->mapped, (const char *)src + done, n);
    if ((s = copy_now(ctx, ctx->staging, 0, b, offset + done, n)) != TP_VK_OK) return s;
    done += n;
  }
  return TP_VK_OK;
}

int32_t tp_vk_buffer_read(tp_vk_ctx *ctx, tp_vk_buffer *b, uint64_t offset, void *dst, uint64_t bytes) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  int s = check_range(ctx, "tp_vk_buffer_read", b, offset, bytes);
  if (s != TP_VK_OK || bytes == 0) return s;
  if (dst == NULL) return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_buffer_read: dst is NULL");
  if ((s = tp_vk_wait(ctx)) != TP_VK_OK) return s;
  if (b->mapped) {
    if (!ctx->coherent) {
      VkMappedMemoryRange range = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = b->memory,
                                   .offset = 0, .size = VK_WHOLE_SIZE};
      ctx->vk.vkInvalidateMappedMemoryRanges(ctx->device, 1, &range);
    }
    memcpy(dst, (const char *)b->mapped + offset, bytes);
    return TP_VK_OK;
  }
  if ((s = staging(ctx)) != TP_VK_OK) return s;
  for (uint64_t done = 0; done < bytes;) {
    uint64_t n = bytes - done < ctx->staging->size ? bytes - done : ctx->staging->size;
    if ((s = copy_now(ctx, b, offset + done, ctx->staging, 0, n)) != TP_VK_OK) return s;
    memcpy((char *)dst + done, ctx->staging->mapped, n);
    done += n;
  }
  return TP_VK_OK;
}

int32_t tp_vk_buffer_copy(tp_vk_ctx *ctx, tp_vk_buffer *src, uint64_t so, tp_vk_buffer *dst, uint64_t d0,
                          uint64_t bytes) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  int s = check_range(ctx, "tp_vk_buffer_copy (source)", src, so, bytes);
  if (s == TP_VK_OK) s = check_range(ctx, "tp_vk_buffer_copy (destination)", dst, d0, bytes);
  if (s != TP_VK_OK || bytes == 0) return s;
  if (src == dst && so < d0 + bytes && d0 < so + bytes)
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_buffer_copy: source and destination overlap");
  tp_vk_frame *f;
  if ((s = tp_vk_record_begin(ctx, &f)) != TP_VK_OK) return s;
  tp_vk_record_begin_command(ctx, f, NULL);
  VkBufferCopy region = {.srcOffset = so, .dstOffset = d0, .size = bytes};
  ctx->vk.vkCmdCopyBuffer(f->cmd, src->buffer, dst->buffer, 1, &region);
  src->last_use = dst->last_use = f->serial;
  tp_vk_record_end_command(ctx, f);
  return TP_VK_OK;
}

int32_t tp_vk_buffer_fill(tp_vk_ctx *ctx, tp_vk_buffer *b, uint64_t offset, uint64_t bytes, uint32_t value) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  int s = check_range(ctx, "tp_vk_buffer_fill", b, offset, bytes);
  if (s != TP_VK_OK || bytes == 0) return s;
  if (offset % 4 || bytes % 4)
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_buffer_fill: offset %llu and size %llu must be multiples of 4",
                      (unsigned long long)offset, (unsigned long long)bytes);
  tp_vk_frame *f;
  if ((s = tp_vk_record_begin(ctx, &f)) != TP_VK_OK) return s;
  tp_vk_record_begin_command(ctx, f, NULL);
  ctx->vk.vkCmdFillBuffer(f->cmd, b->buffer, offset, bytes, value);
  b->last_use = f->serial;
  tp_vk_record_end_command(ctx, f);
  return TP_VK_OK;
}

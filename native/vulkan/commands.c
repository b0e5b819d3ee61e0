/*
 * Pipelines and batches of libtp_vulkan.so.
 *
 * Pipelines: a compute pipeline per SPIR-V module and specialization, with one descriptor set of
 * storage buffers and a push-constant range.
 *
 * Batches: TP_VK_FRAMES frames, each a command buffer, a descriptor pool and a fence. Commands record
 * into the current frame, each followed by a global memory barrier (compute / transfer writes before
 * the next compute / transfer command; barriers order across submissions on one queue, spec §7.6), so
 * an op always sees the results of the ops recorded before it. A frame is submitted when it is full
 * or on tp_vk_submit / tp_vk_wait; recording then moves to the other frame (waiting for it first if
 * it is still in flight), so the host records while the device runs. Each batch has a serial number;
 * a buffer remembers the serial of the last batch that used it, which says when it may be read,
 * written or freed.
 *
 * Source: Vulkan 1.3 specification §6 (Command Buffers), §7 (Synchronization), §14 (Descriptor Sets),
 * §10 (Pipelines: specialization constants).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int tp_vk_commands_init(tp_vk_ctx *ctx) {
  VkCommandPoolCreateInfo cpi = {
      .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
      .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
      .queueFamilyIndex = ctx->queue_family,
  };
  VkResult r = ctx->vk.vkCreateCommandPool(ctx->device, &cpi, NULL, &ctx->command_pool);
  if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkCreateCommandPool");
  for (uint32_t i = 0; i < TP_VK_FRAMES; i++) {
    tp_vk_frame *f = &ctx->frames[i];
    VkCommandBufferAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = ctx->command_pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1,
    };
    if ((r = ctx->vk.vkAllocateCommandBuffers(ctx->device, &ai, &f->cmd)) != VK_SUCCESS)
      return tp_vk_check(ctx, r, "vkAllocateCommandBuffers");
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = ctx->vk.vkCreateFence(ctx->device, &fci, NULL, &f->fence)) != VK_SUCCESS)
      return tp_vk_check(ctx, r, "vkCreateFence");
    VkDescriptorPoolSize size = {
        .type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        .descriptorCount = TP_VK_BATCH_COMMANDS * TP_VK_MAX_BINDINGS,
    };
    VkDescriptorPoolCreateInfo dpi = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        .maxSets = TP_VK_BATCH_COMMANDS,
        .poolSizeCount = 1,
        .pPoolSizes = &size,
    };
    if ((r = ctx->vk.vkCreateDescriptorPool(ctx->device, &dpi, NULL, &f->pool)) != VK_SUCCESS)
      return tp_vk_check(ctx, r, "vkCreateDescriptorPool");
    if (ctx->info.features & TP_VK_FEATURE_TIMESTAMPS) {
      VkQueryPoolCreateInfo qpi = {
          .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
          .queryType = VK_QUERY_TYPE_TIMESTAMP,
          .queryCount = TP_VK_BATCH_QUERIES,
      };
      if (ctx->vk.vkCreateQueryPool(ctx->device, &qpi, NULL, &f->queries) != VK_SUCCESS) f->queries = VK_NULL_HANDLE;
    }
  }
  return TP_VK_OK;
}

void tp_vk_commands_destroy(tp_vk_ctx *ctx) {
  for (uint32_t i = 0; i < TP_VK_FRAMES; i++) {
    tp_vk_frame *f = &ctx->frames[i];
    if (f->queries) ctx->vk.vkDestroyQueryPool(ctx->device, f->queries, NULL);
    if (f->pool) ctx->vk.vkDestroyDescriptorPool(ctx->device, f->pool, NULL);
    if (f->fence) ctx->vk.vkDestroyFence(ctx->device, f->fence, NULL);
  }
  if (ctx->command_pool) ctx->vk.vkDestroyCommandPool(ctx->device, ctx->command_pool, NULL);
  while (ctx->pipelines) {
    tp_vk_pipeline *p = ctx->pipelines;
    ctx->pipelines = p->next;
    ctx->vk.vkDestroyPipeline(ctx->device, p->pipeline, NULL);
    ctx->vk.vkDestroyPipelineLayout(ctx->device, p->layout, NULL);
    ctx->vk.vkDestroyDescriptorSetLayout(ctx->device, p->set_layout, NULL);
    ctx->vk.vkDestroyShaderModule(ctx->device, p->module, NULL);
    free(p);
  }
}

static void barrier(tp_vk_ctx *ctx, VkCommandBuffer cmd, VkPipelineStageFlags dst_stage, VkAccessFlags dst_access) {
  VkMemoryBarrier mb = {
      .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
      .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
      .dstAccessMask = dst_access,
  };
  ctx->vk.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, dst_stage,
                               0, 1, &mb, 0, NULL, 0, NULL);
}

static const VkAccessFlags DEVICE_ACCESS = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
static const VkPipelineStageFlags DEVICE_STAGES = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

/* Wait for frame f's fence and mark its batch done. */
static int frame_wait(tp_vk_ctx *ctx, tp_vk_frame *f) {
  if (!f->in_flight) return TP_VK_OK;
  VkResult r = ctx->vk.vkWaitForFences(ctx->device, 1, &f->fence, VK_TRUE, UINT64_MAX);
  if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkWaitForFences");
  ctx->vk.vkResetFences(ctx->device, 1, &f->fence);
  f->in_flight = 0;
  if (f->serial > ctx->done_serial) ctx->done_serial = f->serial;
  if (f->timed) {
    /* The batch's span, then each command's (before, after) pair, credited to its pipeline. */
    f->timed = 0;
    uint64_t ts[TP_VK_BATCH_QUERIES];
    uint32_t n = 2u + 2u * f->commands;
    const uint64_t fs = ctx->info.timestamp_period_fs;
    if (ctx->vk.vkGetQueryPoolResults(ctx->device, f->queries, 0, n, n * sizeof ts[0], ts, sizeof ts[0],
                                      VK_QUERY_RESULT_64_BIT) == VK_SUCCESS) {
      if (ts[1] >= ts[0]) ctx->stat_gpu_ns += (ts[1] - ts[0]) * fs / 1000000u;
      for (uint32_t i = 0; i < f->commands; i++) {
        tp_vk_pipeline *p = f->timed_pipes[i];
        uint64_t t0 = ts[2 + 2 * i], t1 = ts[3 + 2 * i];
        if (p == NULL) continue;
        p->timed_dispatches++;
        if (t1 >= t0) p->gpu_ns += (t1 - t0) * fs / 1000000u;
      }
    }
  }
  ctx->stat_waits++;
  return TP_VK_OK;
}

int tp_vk_record_begin(tp_vk_ctx *ctx, tp_vk_frame **out) {
  tp_vk_frame *f = &ctx->frames[ctx->current];
  if (!f->recording) {
    int s = frame_wait(ctx, f);
    if (s != TP_VK_OK) return s;
    tp_vk_sweep(ctx);
    ctx->vk.vkResetDescriptorPool(ctx->device, f->pool, 0);
    VkResult r = ctx->vk.vkResetCommandBuffer(f->cmd, 0);
    VkCommandBufferBeginInfo bi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
    };
    if (r == VK_SUCCESS) r = ctx->vk.vkBeginCommandBuffer(f->cmd, &bi);
    if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkBeginCommandBuffer");
    f->timed = ctx->profile && f->queries;
    if (f->timed) {
      ctx->vk.vkCmdResetQueryPool(f->cmd, f->queries, 0, TP_VK_BATCH_QUERIES);
      ctx->vk.vkCmdWriteTimestamp(f->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, f->queries, 0);
    }
    /* Order this batch after everything submitted before it. */
    barrier(ctx, f->cmd, DEVICE_STAGES, DEVICE_ACCESS);
    f->recording = 1;
    f->commands = 0;
    f->serial = ctx->next_serial++;
  }
  *out = f;
  return TP_VK_OK;
}

/* While profiling: a timestamp once the commands before have finished (the barrier after each
 * serialises them), and the pipeline the command's time goes to (NULL: a copy or fill). */
void tp_vk_record_begin_command(tp_vk_ctx *ctx, tp_vk_frame *f, tp_vk_pipeline *p) {
  if (!f->timed) return;
  f->timed_pipes[f->commands] = p;
  ctx->vk.vkCmdWriteTimestamp(f->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, f->queries, 2u + 2u * f->commands);
}

void tp_vk_record_end_command(tp_vk_ctx *ctx, tp_vk_frame *f) {
  if (f->timed)
    ctx->vk.vkCmdWriteTimestamp(f->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, f->queries, 3u + 2u * f->commands);
  barrier(ctx, f->cmd, DEVICE_STAGES, DEVICE_ACCESS);
  f->commands++;
  if (f->commands >= TP_VK_BATCH_COMMANDS) tp_vk_submit(ctx);
}

int32_t tp_vk_submit(tp_vk_ctx *ctx) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  tp_vk_frame *f = &ctx->frames[ctx->current];
  if (!f->recording) return TP_VK_OK;
  /* Make the batch's writes visible to the host (reads of mapped memory after the fence). */
  barrier(ctx, f->cmd, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
  if (f->timed) ctx->vk.vkCmdWriteTimestamp(f->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, f->queries, 1);
  f->recording = 0;
  VkResult r = ctx->vk.vkEndCommandBuffer(f->cmd);
  if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkEndCommandBuffer");
  VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &f->cmd};
  r = ctx->vk.vkQueueSubmit(ctx->queue, 1, &si, f->fence);
  if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkQueueSubmit");
  f->in_flight = 1;
  ctx->stat_batches++;
  ctx->current = (ctx->current + 1) % TP_VK_FRAMES;
  return TP_VK_OK;
}

int32_t tp_vk_wait(tp_vk_ctx *ctx) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  int s = tp_vk_submit(ctx);
  if (s != TP_VK_OK) return s;
  for (uint32_t i = 0; i < TP_VK_FRAMES; i++)
    if ((s = frame_wait(ctx, &ctx->frames[i])) != TP_VK_OK) return s;
  tp_vk_sweep(ctx);
  return TP_VK_OK;
}

/* Wait until the batch `serial` (and every one before it) has finished. */
int tp_vk_wait_serial(tp_vk_ctx *ctx, uint64_t serial) {
  if (serial <= ctx->done_serial) return TP_VK_OK;
  /* Only the batches up to `serial`: a later batch in flight keeps running (a write into a buffer that
   * an earlier batch read overlaps the work after it). The recording batch is submitted first. */
  tp_vk_frame *rec = &ctx->frames[ctx->current];
  int s;
  if (rec->recording && rec->serial <= serial && (s = tp_vk_submit(ctx)) != TP_VK_OK) return s;
  for (uint32_t i = 0; i < TP_VK_FRAMES; i++) {
    tp_vk_frame *f = &ctx->frames[i];
    if (f->in_flight && f->serial <= serial && (s = frame_wait(ctx, f)) != TP_VK_OK) return s;
  }
  if (serial > ctx->done_serial) return tp_vk_wait(ctx); /* not expected: every batch up to it was waited */
  tp_vk_sweep(ctx);
  return TP_VK_OK;
}

int32_t tp_vk_pipeline_create(tp_vk_ctx *ctx, const void *spirv, uint64_t spirv_bytes, uint32_t n_buffers,
                              uint32_t push_bytes, const uint32_t *spec, uint32_t n_spec, tp_vk_pipeline **out) {
  if (ctx == NULL || out == NULL) return TP_VK_ERR_ARG;
  *out = NULL;
  if (spirv == NULL || spirv_bytes < 20 || spirv_bytes % 4 || ((const uint32_t *)spirv)[0] != 0x07230203u)
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_pipeline_create: %llu bytes are not a SPIR-V module",
                      (unsigned long long)spirv_bytes);
  if (n_buffers > TP_VK_MAX_BINDINGS)
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_pipeline_create: %u bindings (at most %u)", n_buffers,
                      TP_VK_MAX_BINDINGS);
  if (push_bytes % 4 || push_bytes > ctx->info.max_push_constants)
    return tp_vk_fail(ctx, TP_VK_ERR_ARG,
                      "tp_vk_pipeline_create: %u bytes of push constants (a multiple of 4, at most %llu on %s)",
                      push_bytes, (unsigned long long)ctx->info.max_push_constants, ctx->info.name);
  if (n_spec > 16 || (n_spec > 0 && spec == NULL))
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_pipeline_create: %u specialization constants (at most 16)", n_spec);
  tp_vk_pipeline *p = calloc(1, sizeof *p);
  if (p == NULL) return tp_vk_fail(ctx, TP_VK_ERR_OOM, "tp_vk_pipeline_create: out of host memory");
  p->n_buffers = n_buffers;
  p->push_bytes = push_bytes;
  VkShaderModuleCreateInfo smi = {
      .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
      .codeSize = (size_t)spirv_bytes,
      .pCode = spirv,
  };
  VkResult r = ctx->vk.vkCreateShaderModule(ctx->device, &smi, NULL, &p->module);
  VkDescriptorSetLayoutBinding bindings[TP_VK_MAX_BINDINGS];
  for (uint32_t i = 0; i < n_buffers; i++)
    bindings[i] = (VkDescriptorSetLayoutBinding){
        .binding = i,
        .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        .descriptorCount = 1,
        .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
    };
  VkDescriptorSetLayoutCreateInfo dli = {
      .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
      .bindingCount = n_buffers,
      .pBindings = bindings,
  };
  if (r == VK_SUCCESS) r = ctx->vk.vkCreateDescriptorSetLayout(ctx->device, &dli, NULL, &p->set_layout);
  VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = push_bytes};
  VkPipelineLayoutCreateInfo pli = {
      .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
      .setLayoutCount = 1,
      .pSetLayouts = &p->set_layout,
      .pushConstantRangeCount = push_bytes ? 1u : 0u,
      .pPushConstantRanges = &pcr,
  };
  if (r == VK_SUCCESS) r = ctx->vk.vkCreatePipelineLayout(ctx->device, &pli, NULL, &p->layout);
  VkSpecializationMapEntry entries[16];
  for (uint32_t i = 0; i < n_spec; i++)
    entries[i] = (VkSpecializationMapEntry){.constantID = i, .offset = 4 * i, .size = 4};
  VkSpecializationInfo si = {
      .mapEntryCount = n_spec,
      .pMapEntries = entries,
      .dataSize = 4 * (size_t)n_spec,
      .pData = spec,
  };
  VkComputePipelineCreateInfo cpi = {
      .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
      .stage =
          {
              .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
              .stage = VK_SHADER_STAGE_COMPUTE_BIT,
              .module = p->module,
              .pName = "main",
              .pSpecializationInfo = n_spec ? &si : NULL,
          },
      .layout = p->layout,
  };
  if (r == VK_SUCCESS) r = ctx->vk.vkCreateComputePipelines(ctx->device, VK_NULL_HANDLE, 1, &cpi, NULL, &p->pipeline);
  if (r != VK_SUCCESS) {
    int s = tp_vk_check(ctx, r, "creating a compute pipeline");
    if (p->layout) ctx->vk.vkDestroyPipelineLayout(ctx->device, p->layout, NULL);
    if (p->set_layout) ctx->vk.vkDestroyDescriptorSetLayout(ctx->device, p->set_layout, NULL);
    if (p->module) ctx->vk.vkDestroyShaderModule(ctx->device, p->module, NULL);
    free(p);
    return s;
  }
  p->next = ctx->pipelines;
  ctx->pipelines = p;
  *out = p;
  return TP_VK_OK;
}

int32_t tp_vk_dispatch(tp_vk_ctx *ctx, tp_vk_pipeline *p, const uint64_t *bindings, uint32_t n_bindings,
                       const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  const tp_vk_device_info *info = &ctx->info;
  if (p == NULL) return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_dispatch: pipeline is NULL");
  if (n_bindings != p->n_buffers || (n_bindings && bindings == NULL))
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_dispatch: %u bindings for a pipeline of %u", n_bindings, p->n_buffers);
  if (push_bytes != p->push_bytes || (push_bytes && push == NULL))
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_dispatch: %u bytes of push constants for a pipeline of %u",
                      push_bytes, p->push_bytes);
  if (gx > info->max_workgroup_count[0] || gy > info->max_workgroup_count[1] || gz > info->max_workgroup_count[2])
    return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_dispatch: %u x %u x %u workgroups, past %s's %llu x %llu x %llu", gx,
                      gy, gz, info->name, (unsigned long long)info->max_workgroup_count[0],
                      (unsigned long long)info->max_workgroup_count[1], (unsigned long long)info->max_workgroup_count[2]);
  VkDescriptorBufferInfo infos[TP_VK_MAX_BINDINGS];
  tp_vk_buffer *bufs[TP_VK_MAX_BINDINGS];
  for (uint32_t i = 0; i < n_bindings; i++) {
    tp_vk_buffer *b = (tp_vk_buffer *)(uintptr_t)bindings[3 * i];
    uint64_t offset = bindings[3 * i + 1], range = bindings[3 * i + 2];
    if (b == NULL || b->dead)
      return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_dispatch: binding %u is %s", i, b ? "a destroyed buffer" : "NULL");
    if (range == 0 || offset > b->alloc_size || range > b->alloc_size - offset)
      return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_dispatch: binding %u, bytes [%llu, %llu), is outside its buffer of %llu bytes",
                        i, (unsigned long long)offset, (unsigned long long)(offset + range),
                        (unsigned long long)b->alloc_size);
    if (offset % info->min_storage_buffer_offset_alignment)
      return tp_vk_fail(ctx, TP_VK_ERR_ARG, "tp_vk_dispatch: binding %u offset %llu is not a multiple of %llu (%s)", i,
                        (unsigned long long)offset, (unsigned long long)info->min_storage_buffer_offset_alignment,
                        info->name);
    if (range > info->max_storage_buffer_range)
      return tp_vk_fail(ctx, TP_VK_ERR_ARG,
                        "tp_vk_dispatch: binding %u spans %llu bytes, past maxStorageBufferRange %llu of %s", i,
                        (unsigned long long)range, (unsigned long long)info->max_storage_buffer_range, info->name);
    bufs[i] = b;
    infos[i] = (VkDescriptorBufferInfo){.buffer = b->buffer, .offset = offset, .range = range};
  }
  if (gx == 0 || gy == 0 || gz == 0) return TP_VK_OK; /* nothing to run */
  tp_vk_frame *f;
  int s = tp_vk_record_begin(ctx, &f);
  if (s != TP_VK_OK) return s;
  VkDescriptorSet set = VK_NULL_HANDLE;
  if (n_bindings) {
    VkDescriptorSetAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
        .descriptorPool = f->pool,
        .descriptorSetCount = 1,
        .pSetLayouts = &p->set_layout,
    };
    VkResult r = ctx->vk.vkAllocateDescriptorSets(ctx->device, &ai, &set);
    if (r == VK_ERROR_OUT_OF_POOL_MEMORY || r == VK_ERROR_FRAGMENTED_POOL) {
      /* The pool holds a full batch's worth; start a new batch. */
      if ((s = tp_vk_submit(ctx)) != TP_VK_OK || (s = tp_vk_record_begin(ctx, &f)) != TP_VK_OK) return s;
      ai.descriptorPool = f->pool;
      r = ctx->vk.vkAllocateDescriptorSets(ctx->device, &ai, &set);
    }
    if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkAllocateDescriptorSets");
    VkWriteDescriptorSet writes[TP_VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < n_bindings; i++)
      writes[i] = (VkWriteDescriptorSet){
          .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
          .dstSet = set,
          .dstBinding = i,
          .descriptorCount = 1,
          .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
          .pBufferInfo = &infos[i],
      };
    ctx->vk.vkUpdateDescriptorSets(ctx->device, n_bindings, writes, 0, NULL);
  }
  tp_vk_record_begin_command(ctx, f, p);
  ctx->vk.vkCmdBindPipeline(f->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipeline);
  if (n_bindings)
    ctx->vk.vkCmdBindDescriptorSets(f->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
  if (push_bytes) ctx->vk.vkCmdPushConstants(f->cmd, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
  ctx->vk.vkCmdDispatch(f->cmd, gx, gy, gz);
  for (uint32_t i = 0; i < n_bindings; i++) bufs[i]->last_use = f->serial;
  ctx->stat_dispatches++;
  tp_vk_record_end_command(ctx, f);
  return TP_VK_OK;
}

int32_t tp_vk_stats(const tp_vk_ctx *ctx, uint64_t *out, uint32_t n) {
  if (ctx == NULL || (n && out == NULL)) return TP_VK_ERR_ARG;
  const uint64_t v[7] = {ctx->stat_dispatches, ctx->stat_batches, ctx->stat_waits,  ctx->stat_live,
                         ctx->stat_live_bytes, ctx->stat_pending, ctx->stat_gpu_ns};
  for (uint32_t i = 0; i < n && i < 7; i++) out[i] = v[i];
  return TP_VK_OK;
}

int32_t tp_vk_profile(tp_vk_ctx *ctx, int32_t enable) {
  if (ctx == NULL) return TP_VK_ERR_ARG;
  if (enable && !(ctx->info.features & TP_VK_FEATURE_TIMESTAMPS))
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "Vulkan device %s has no timestamps on its compute queue",
                      ctx->info.name);
  ctx->profile = enable != 0;
  ctx->stat_gpu_ns = 0;
  for (tp_vk_pipeline *p = ctx->pipelines; p; p = p->next) p->timed_dispatches = 0, p->gpu_ns = 0;
  return TP_VK_OK;
}

int32_t tp_vk_pipeline_stats(const tp_vk_ctx *ctx, const tp_vk_pipeline *pipeline, uint64_t *out, uint32_t n) {
  if (ctx == NULL || pipeline == NULL || (n && out == NULL)) return TP_VK_ERR_ARG;
  const uint64_t v[2] = {pipeline->timed_dispatches, pipeline->gpu_ns};
  for (uint32_t i = 0; i < n && i < 2; i++) out[i] = v[i];
  return TP_VK_OK;
}

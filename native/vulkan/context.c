/*
 * Loader, instance and device of libtp_vulkan.so: dlopen of the Vulkan loader, a Vulkan 1.1+ instance,
 * the choice of a physical device (an index, a name, or the best type: discrete, integrated, virtual,
 * CPU), a device with one compute queue and every optional feature the kernels may use, the device
 * report (tp_vk_info, printed with TP_VK_VERBOSE), and the per-context error message.
 *
 * Source: the Vulkan 1.3 specification, chapters 4 (Initialization), 5 (Devices and Queues) and 38
 * (Features); the loader's soname and lookup rules from Khronos' LoaderInterfaceArchitecture.md.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int32_t tp_vk_abi_version(void) { return TP_VK_ABI_VERSION; }

int tp_vk_fail(tp_vk_ctx *ctx, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
  va_end(ap);
  return status;
}

const char *tp_vk_result_name(VkResult r) {
  switch (r) {
#define CASE(x) \
  case x:       \
    return #x;
    CASE(VK_SUCCESS)
    CASE(VK_NOT_READY)
    CASE(VK_TIMEOUT)
    CASE(VK_INCOMPLETE)
    CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    CASE(VK_ERROR_INITIALIZATION_FAILED)
    CASE(VK_ERROR_DEVICE_LOST)
    CASE(VK_ERROR_MEMORY_MAP_FAILED)
    CASE(VK_ERROR_LAYER_NOT_PRESENT)
    CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    CASE(VK_ERROR_TOO_MANY_OBJECTS)
    CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    CASE(VK_ERROR_FRAGMENTED_POOL)
    CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    CASE(VK_ERROR_INVALID_SHADER_NV)
#undef CASE
    default:
      return "VkResult (unknown)";
  }
}

/* Turn a failed VkResult into a status with a message naming the call and the device. */
int tp_vk_check(tp_vk_ctx *ctx, VkResult r, const char *what) {
  if (r == VK_SUCCESS) return TP_VK_OK;
  const char *dev = ctx->info.name[0] ? ctx->info.name : "the Vulkan device";
  int status = TP_VK_ERR_INTERNAL;
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_TOO_MANY_OBJECTS)
    status = TP_VK_ERR_OOM;
  else if (r == VK_ERROR_FEATURE_NOT_PRESENT || r == VK_ERROR_EXTENSION_NOT_PRESENT ||
           r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_LAYER_NOT_PRESENT)
    status = TP_VK_ERR_UNSUPPORTED;
  return tp_vk_fail(ctx, status, "%s failed on %s: %s (%d)", what, dev, tp_vk_result_name(r), (int)r);
}

static const char *type_name(uint64_t t) {
  switch (t) {
    case TP_VK_DEVICE_INTEGRATED:
      return "integrated GPU";
    case TP_VK_DEVICE_DISCRETE:
      return "discrete GPU";
    case TP_VK_DEVICE_VIRTUAL:
      return "virtual GPU";
    case TP_VK_DEVICE_CPU:
      return "CPU";
    default:
      return "other";
  }
}

/* Lower is better: discrete, integrated, virtual, CPU, other. */
static int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return 3;
    default:
      return 4;
  }
}

/* The first queue family with compute, preferring one without graphics (a dedicated compute queue). */
static int compute_family(tp_vk_ctx *ctx, VkPhysicalDevice pd, uint32_t *family, uint32_t *ts_bits) {
  uint32_t n = 0;
  ctx->vk.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
  if (n == 0 || n > 64) return 0;
  VkQueueFamilyProperties q[64];
  ctx->vk.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
  int best = -1;
  for (uint32_t i = 0; i < n; i++) {
    if (!(q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || q[i].queueCount == 0) continue;
    if (best < 0 || ((q[best].queueFlags & VK_QUEUE_GRAPHICS_BIT) && !(q[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)))
      best = (int)i;
  }
  if (best < 0) return 0;
  *family = (uint32_t)best;
  *ts_bits = q[best].timestampValidBits;
  return 1;
}

/* "0: llvmpipe (LLVM 15.0.6, 256 bits) [CPU, Vulkan 1.3]; 1: ..." into buf. */
static void list_devices(tp_vk_ctx *ctx, VkPhysicalDevice *pds, uint32_t n, char *buf, size_t len) {
  buf[0] = 0;
  size_t at = 0;
  for (uint32_t i = 0; i < n && at < len; i++) {
    VkPhysicalDeviceProperties p;
    ctx->vk.vkGetPhysicalDeviceProperties(pds[i], &p);
    int w = snprintf(buf + at, len - at, "%s%u: %s [%s, Vulkan %u.%u]", i ? "; " : "", i, p.deviceName,
                     type_name((uint64_t)p.deviceType), VK_API_VERSION_MAJOR(p.apiVersion),
                     VK_API_VERSION_MINOR(p.apiVersion));
    if (w < 0) break;
    at += (size_t)w;
  }
}

static int has_layer(tp_vk_ctx *ctx, const char *name) {
  uint32_t n = 0;
  if (ctx->vk.vkEnumerateInstanceLayerProperties == NULL) return 0;
  if (ctx->vk.vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) return 0;
  VkLayerProperties *props = calloc(n, sizeof *props);
  if (props == NULL) return 0;
  int found = 0;
  if (ctx->vk.vkEnumerateInstanceLayerProperties(&n, props) == VK_SUCCESS)
    for (uint32_t i = 0; i < n; i++)
      if (strcmp(props[i].layerName, name) == 0) found = 1;
  free(props);
  return found;
}

static int open_loader(tp_vk_ctx *ctx, const char *loader) {
  const char *name = loader && loader[0] ? loader : "libvulkan.so.1";
  dlerror();
  ctx->loader = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (ctx->loader == NULL) {
    const char *why = dlerror();
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED,
                      "cannot load the Vulkan loader %s: %s; install it (Debian/Ubuntu: apt-get install libvulkan1 "
                      "mesa-vulkan-drivers) or set TP_VULKAN_LOADER to its path",
                      name, why ? why : "not found");
  }
  ctx->vk.vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(ctx->loader, "vkGetInstanceProcAddr");
  if (ctx->vk.vkGetInstanceProcAddr == NULL)
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "%s is not a Vulkan loader: it has no vkGetInstanceProcAddr", name);
  PFN_vkGetInstanceProcAddr gipa = ctx->vk.vkGetInstanceProcAddr;
  ctx->vk.vkCreateInstance = (PFN_vkCreateInstance)gipa(NULL, "vkCreateInstance");
  ctx->vk.vkEnumerateInstanceVersion = (PFN_vkEnumerateInstanceVersion)gipa(NULL, "vkEnumerateInstanceVersion");
  ctx->vk.vkEnumerateInstanceLayerProperties =
      (PFN_vkEnumerateInstanceLayerProperties)gipa(NULL, "vkEnumerateInstanceLayerProperties");
  if (ctx->vk.vkCreateInstance == NULL)
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "the Vulkan loader %s has no vkCreateInstance", name);
  return TP_VK_OK;
}

static int create_instance(tp_vk_ctx *ctx) {
  uint32_t version = VK_API_VERSION_1_0;
  if (ctx->vk.vkEnumerateInstanceVersion) ctx->vk.vkEnumerateInstanceVersion(&version);
  if (version < VK_API_VERSION_1_1)
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED,
                      "the Vulkan loader supports Vulkan %u.%u; the vulkan backend needs 1.1 or newer (update "
                      "libvulkan1)",
                      VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
  VkApplicationInfo app = {
      .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
      .pApplicationName = "TensorPencil",
      .pEngineName = "tp_vulkan",
      .apiVersion = version >= VK_API_VERSION_1_2 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_1,
  };
  const char *layers[1] = {"VK_LAYER_KHRONOS_validation"};
  int validation = (ctx->flags & TP_VK_VALIDATION) && has_layer(ctx, layers[0]);
  if ((ctx->flags & TP_VK_VALIDATION) && !validation)
    fprintf(stderr, "tp_vulkan: VK_LAYER_KHRONOS_validation is not installed (apt-get install vulkan-validationlayers)\n");
  VkInstanceCreateInfo ci = {
      .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
      .pApplicationInfo = &app,
      .enabledLayerCount = validation ? 1u : 0u,
      .ppEnabledLayerNames = validation ? layers : NULL,
  };
  VkResult r = ctx->vk.vkCreateInstance(&ci, NULL, &ctx->instance);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED,
                      "no Vulkan driver found (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER); install one "
                      "(Debian/Ubuntu: apt-get install mesa-vulkan-drivers, or the GPU vendor's driver)");
  if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkCreateInstance");
#define TP_VK_LOAD(fn)                                                       \
  ctx->vk.fn = (PFN_##fn)ctx->vk.vkGetInstanceProcAddr(ctx->instance, #fn);  \
  if (ctx->vk.fn == NULL)                                                    \
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "the Vulkan loader lacks " #fn " (Vulkan 1.1)");
  TP_VK_INSTANCE_FUNCTIONS(TP_VK_LOAD)
#undef TP_VK_LOAD
  return TP_VK_OK;
}

static int choose_device(tp_vk_ctx *ctx, int32_t index, const char *name) {
  uint32_t n = 0;
  VkResult r = ctx->vk.vkEnumeratePhysicalDevices(ctx->instance, &n, NULL);
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return tp_vk_check(ctx, r, "vkEnumeratePhysicalDevices");
  if (n == 0)
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED,
                      "the Vulkan loader reports no device; install a driver (Debian/Ubuntu: apt-get install "
                      "mesa-vulkan-drivers for the llvmpipe CPU device, or the GPU vendor's driver)");
  if (n > 32) n = 32;
  VkPhysicalDevice pds[32];
  r = ctx->vk.vkEnumeratePhysicalDevices(ctx->instance, &n, pds);
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return tp_vk_check(ctx, r, "vkEnumeratePhysicalDevices");
  char listing[700];
  list_devices(ctx, pds, n, listing, sizeof listing);
  int chosen = -1;
  if (index >= 0) {
    if ((uint32_t)index >= n)
      return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "Vulkan device index %d is out of range; %u device%s: %s", index,
                        n, n == 1 ? "" : "s", listing);
    chosen = index;
  } else if (name && name[0]) {
    for (uint32_t i = 0; i < n && chosen < 0; i++) {
      VkPhysicalDeviceProperties p;
      ctx->vk.vkGetPhysicalDeviceProperties(pds[i], &p);
      if (strstr(p.deviceName, name)) chosen = (int)i;
    }
    if (chosen < 0)
      return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "no Vulkan device name contains '%s'; devices: %s", name, listing);
  } else {
    int best_rank = 99;
    for (uint32_t i = 0; i < n; i++) {
      VkPhysicalDeviceProperties p;
      uint32_t fam, ts;
      ctx->vk.vkGetPhysicalDeviceProperties(pds[i], &p);
      if (p.apiVersion < VK_API_VERSION_1_1 || !compute_family(ctx, pds[i], &fam, &ts)) continue;
      if (type_rank(p.deviceType) < best_rank) {
        best_rank = type_rank(p.deviceType);
        chosen = (int)i;
      }
    }
    if (chosen < 0)
      return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "no Vulkan 1.1 device with a compute queue; devices: %s", listing);
  }
  VkPhysicalDeviceProperties p;
  ctx->vk.vkGetPhysicalDeviceProperties(pds[chosen], &p);
  if (p.apiVersion < VK_API_VERSION_1_1)
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "Vulkan device %d (%s) supports Vulkan %u.%u; 1.1 is needed",
                      chosen, p.deviceName, VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion));
  uint32_t ts_bits = 0;
  if (!compute_family(ctx, pds[chosen], &ctx->queue_family, &ts_bits))
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "Vulkan device %d (%s) has no compute queue", chosen, p.deviceName);
  ctx->physical = pds[chosen];

  tp_vk_device_info *info = &ctx->info;
  info->struct_bytes = sizeof *info;
  info->device_index = (uint64_t)chosen;
  info->device_count = n;
  info->device_type = (uint64_t)p.deviceType;
  info->api_version = p.apiVersion;
  info->driver_version = p.driverVersion;
  info->vendor_id = p.vendorID;
  info->device_id = p.deviceID;
  info->max_storage_buffer_range = p.limits.maxStorageBufferRange;
  info->min_storage_buffer_offset_alignment = p.limits.minStorageBufferOffsetAlignment;
  info->max_compute_shared_memory = p.limits.maxComputeSharedMemorySize;
  info->max_workgroup_invocations = p.limits.maxComputeWorkGroupInvocations;
  for (int i = 0; i < 3; i++) {
    info->max_workgroup_size[i] = p.limits.maxComputeWorkGroupSize[i];
    info->max_workgroup_count[i] = p.limits.maxComputeWorkGroupCount[i];
  }
  info->max_push_constants = p.limits.maxPushConstantsSize;
  if (ts_bits > 0 && p.limits.timestampPeriod > 0) {
    info->features |= TP_VK_FEATURE_TIMESTAMPS;
    info->timestamp_period_fs = (uint64_t)(p.limits.timestampPeriod * 1e6);
  }
  snprintf(info->name, sizeof info->name, "%s", p.deviceName);

  /* Vulkan 1.1 properties: maintenance3 (max allocation), subgroups; 1.2: driver name. */
  VkPhysicalDeviceDriverProperties driver = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceSubgroupProperties subgroup = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
                                               .pNext = &subgroup};
  if (p.apiVersion >= VK_API_VERSION_1_2) subgroup.pNext = &driver;
  VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
  ctx->vk.vkGetPhysicalDeviceProperties2(ctx->physical, &p2);
  info->max_memory_allocation_size = m3.maxMemoryAllocationSize;
  info->subgroup_size = subgroup.subgroupSize;
  const VkSubgroupFeatureFlags need =
      VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
  if ((subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && (subgroup.supportedOperations & need) == need)
    info->features |= TP_VK_FEATURE_SUBGROUP;
  if (p.apiVersion >= VK_API_VERSION_1_2)
    snprintf(info->driver, sizeof info->driver, "%.120s %.120s", driver.driverName, driver.driverInfo);
  return TP_VK_OK;
}

static int create_device(tp_vk_ctx *ctx) {
  tp_vk_device_info *info = &ctx->info;
  VkPhysicalDeviceFeatures f10;
  ctx->vk.vkGetPhysicalDeviceFeatures(ctx->physical, &f10);
  /* Optional features: enabled when present, reported in info->features; kernels that need one are
   * only used where it is present (the TypeScript side checks the bits). */
  VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDevice16BitStorageFeatures s16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  int v12 = info->api_version >= VK_API_VERSION_1_2;
  if (v12) s16.pNext = &f12;
  VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &s16};
  ctx->vk.vkGetPhysicalDeviceFeatures2(ctx->physical, &f2);

  VkPhysicalDeviceVulkan12Features e12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDevice16BitStorageFeatures e16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  VkPhysicalDeviceFeatures e10 = {0};
  if (f10.shaderInt64) e10.shaderInt64 = VK_TRUE, info->features |= TP_VK_FEATURE_INT64;
  if (f10.shaderFloat64) e10.shaderFloat64 = VK_TRUE, info->features |= TP_VK_FEATURE_FLOAT64;
  if (f10.shaderInt16) e10.shaderInt16 = VK_TRUE;
  if (s16.storageBuffer16BitAccess) e16.storageBuffer16BitAccess = VK_TRUE, info->features |= TP_VK_FEATURE_STORAGE16;
  if (v12) {
    if (f12.shaderFloat16) e12.shaderFloat16 = VK_TRUE, info->features |= TP_VK_FEATURE_FLOAT16;
    if (f12.shaderInt8) e12.shaderInt8 = VK_TRUE, info->features |= TP_VK_FEATURE_INT8;
    if (f12.storageBuffer8BitAccess) e12.storageBuffer8BitAccess = VK_TRUE, info->features |= TP_VK_FEATURE_STORAGE8;
    e16.pNext = &e12;
  }
  /* VK_EXT_memory_budget, when the device offers it: the heap budget and usage (tp_vk_memory_budget). */
  const char *extensions[1];
  uint32_t n_extensions = 0;
  uint32_t n_props = 0;
  if (ctx->vk.vkEnumerateDeviceExtensionProperties(ctx->physical, NULL, &n_props, NULL) == VK_SUCCESS && n_props > 0) {
    VkExtensionProperties *props = calloc(n_props, sizeof *props);
    if (props != NULL &&
        ctx->vk.vkEnumerateDeviceExtensionProperties(ctx->physical, NULL, &n_props, props) >= VK_SUCCESS) {
      for (uint32_t i = 0; i < n_props; i++)
        if (strcmp(props[i].extensionName, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME) == 0) {
          extensions[n_extensions++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
          ctx->memory_budget_ext = 1;
          break;
        }
    }
    free(props);
  }
  float priority = 1.0f;
  VkDeviceQueueCreateInfo qci = {
      .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
      .queueFamilyIndex = ctx->queue_family,
      .queueCount = 1,
      .pQueuePriorities = &priority,
  };
  VkDeviceCreateInfo dci = {
      .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
      .pNext = &e16,
      .queueCreateInfoCount = 1,
      .pQueueCreateInfos = &qci,
      .pEnabledFeatures = &e10,
      .enabledExtensionCount = n_extensions,
      .ppEnabledExtensionNames = n_extensions ? extensions : NULL,
  };
  VkResult r = ctx->vk.vkCreateDevice(ctx->physical, &dci, NULL, &ctx->device);
  if (r != VK_SUCCESS) return tp_vk_check(ctx, r, "vkCreateDevice");
#define TP_VK_LOAD(fn)                                                       \
  ctx->vk.fn = (PFN_##fn)ctx->vk.vkGetDeviceProcAddr(ctx->device, #fn);      \
  if (ctx->vk.fn == NULL)                                                    \
    return tp_vk_fail(ctx, TP_VK_ERR_UNSUPPORTED, "the Vulkan driver of %s lacks " #fn, info->name);
  TP_VK_DEVICE_FUNCTIONS(TP_VK_LOAD)
#undef TP_VK_LOAD
  ctx->vk.vkGetDeviceQueue(ctx->device, ctx->queue_family, 0, &ctx->queue);
  return TP_VK_OK;
}

static void print_info(const tp_vk_ctx *ctx) {
  const tp_vk_device_info *i = &ctx->info;
  fprintf(stderr,
          "vulkan: device %llu of %llu: %s (%s, Vulkan %u.%u.%u%s%s)\n"
          "vulkan:   memory: %.2f GiB device-local, %s; max allocation %.2f GiB, max storage-buffer range "
          "%.2f MiB, offset alignment %llu\n"
          "vulkan:   compute: %llu invocations per workgroup (%llu x %llu x %llu), groups up to %llu x %llu x %llu, "
          "%llu KiB shared memory, %llu B push constants, subgroup %llu\n"
          "vulkan:   features:%s%s%s%s%s%s%s%s%s\n",
          (unsigned long long)i->device_index, (unsigned long long)i->device_count, i->name, type_name(i->device_type),
          VK_API_VERSION_MAJOR(i->api_version), VK_API_VERSION_MINOR(i->api_version),
          VK_API_VERSION_PATCH(i->api_version), i->driver[0] ? ", " : "", i->driver,
          (double)i->device_local_bytes / (1 << 30), i->unified_memory ? "mapped directly" : "through staging",
          (double)i->max_memory_allocation_size / (1 << 30), (double)i->max_storage_buffer_range / (1 << 20),
          (unsigned long long)i->min_storage_buffer_offset_alignment,
          (unsigned long long)i->max_workgroup_invocations, (unsigned long long)i->max_workgroup_size[0],
          (unsigned long long)i->max_workgroup_size[1], (unsigned long long)i->max_workgroup_size[2],
          (unsigned long long)i->max_workgroup_count[0], (unsigned long long)i->max_workgroup_count[1],
          (unsigned long long)i->max_workgroup_count[2], (unsigned long long)i->max_compute_shared_memory / 1024,
          (unsigned long long)i->max_push_constants, (unsigned long long)i->subgroup_size,
          i->features & TP_VK_FEATURE_SUBGROUP ? " subgroup-ops" : "",
          i->features & TP_VK_FEATURE_FLOAT16 ? " float16" : "", i->features & TP_VK_FEATURE_INT8 ? " int8" : "",
          i->features & TP_VK_FEATURE_STORAGE16 ? " storage16" : "",
          i->features & TP_VK_FEATURE_STORAGE8 ? " storage8" : "", i->features & TP_VK_FEATURE_FLOAT64 ? " float64" : "",
          i->features & TP_VK_FEATURE_INT64 ? " int64" : "", i->features & TP_VK_FEATURE_TIMESTAMPS ? " timestamps" : "",
          ctx->memory_budget_ext ? " memory-budget" : "");
}

int32_t tp_vk_create(const char *loader, int32_t device_index, const char *device_name, uint32_t flags,
                     tp_vk_ctx **out, char *err, uint64_t err_bytes) {
  if (err && err_bytes) err[0] = 0;
  if (out == NULL) {
    if (err && err_bytes) snprintf(err, err_bytes, "tp_vk_create: out is NULL");
    return TP_VK_ERR_ARG;
  }
  *out = NULL;
  tp_vk_ctx *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) {
    if (err && err_bytes) snprintf(err, err_bytes, "tp_vk_create: out of host memory");
    return TP_VK_ERR_OOM;
  }
  ctx->flags = flags;
  ctx->next_serial = 1;
  int s = open_loader(ctx, loader);
  if (s == TP_VK_OK) s = create_instance(ctx);
  if (s == TP_VK_OK) s = choose_device(ctx, device_index, device_name);
  if (s == TP_VK_OK) s = create_device(ctx);
  if (s == TP_VK_OK) s = tp_vk_memory_init(ctx);
  if (s == TP_VK_OK) s = tp_vk_commands_init(ctx);
  if (s != TP_VK_OK) {
    if (err && err_bytes) snprintf(err, err_bytes, "%s", ctx->error);
    tp_vk_destroy(ctx);
    return s;
  }
  if (flags & TP_VK_VERBOSE) print_info(ctx);
  *out = ctx;
  return TP_VK_OK;
}

void tp_vk_destroy(tp_vk_ctx *ctx) {
  if (ctx == NULL) return;
  if (ctx->device) {
    if (ctx->vk.vkDeviceWaitIdle) ctx->vk.vkDeviceWaitIdle(ctx->device);
    tp_vk_commands_destroy(ctx);
    while (ctx->buffers) tp_vk_buffer_free_now(ctx, ctx->buffers);
    ctx->staging = NULL;
    ctx->vk.vkDestroyDevice(ctx->device, NULL);
  }
  if (ctx->instance) ctx->vk.vkDestroyInstance(ctx->instance, NULL);
  if (ctx->loader) dlclose(ctx->loader);
  free(ctx);
}

const char *tp_vk_error(const tp_vk_ctx *ctx) { return ctx ? ctx->error : "no context"; }

int32_t tp_vk_info(const tp_vk_ctx *ctx, tp_vk_device_info *out, uint64_t out_bytes) {
  if (ctx == NULL || out == NULL || out_bytes != sizeof *out) return TP_VK_ERR_ARG;
  *out = ctx->info;
  return TP_VK_OK;
}

int32_t tp_vk_memory_budget(tp_vk_ctx *ctx, uint64_t *out, uint32_t n) {
  if (ctx == NULL || out == NULL || n == 0) return TP_VK_ERR_ARG;
  uint64_t v[4] = {ctx->memory_budget_ext ? 1u : 0u, 0, 0, 0};
  VkPhysicalDeviceMemoryBudgetPropertiesEXT budget = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
  VkPhysicalDeviceMemoryProperties2 m2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
                                          .pNext = ctx->memory_budget_ext ? &budget : NULL};
  ctx->vk.vkGetPhysicalDeviceMemoryProperties2(ctx->physical, &m2);
  const VkPhysicalDeviceMemoryProperties *m = &m2.memoryProperties;
  /* The heaps buffers are allocated from: those of the buffer memory types (device-local, or the
   * host-visible heaps of a CPU device without device-local memory). */
  uint32_t heaps = 0;
  for (uint32_t t = 0; t < m->memoryTypeCount && t < 32; t++)
    if (ctx->buffer_type_bits & (1u << t)) heaps |= 1u << m->memoryTypes[t].heapIndex;
  for (uint32_t h = 0; h < m->memoryHeapCount && h < VK_MAX_MEMORY_HEAPS; h++) {
    if (!(heaps & (1u << h))) continue;
    v[3] += m->memoryHeaps[h].size;
    if (ctx->memory_budget_ext) {
      v[1] += budget.heapBudget[h];
      v[2] += budget.heapUsage[h];
    }
  }
  for (uint32_t i = 0; i < n && i < 4; i++) out[i] = v[i];
  return TP_VK_OK;
}

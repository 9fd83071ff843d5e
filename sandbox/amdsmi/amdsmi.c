/*
 * Stand-in libamd_smi.so for the sandbox.
 *
 * Loaded unchanged by the amdsmi Python binding, which binds every symbol of the library at
 * import (stubs.c answers AMDSMI_STATUS_NOT_SUPPORTED for those not implemented here). It
 * answers what the agent's admission asks: init, the sockets and their GPUs, each GPU's
 * driver, ASIC and board names, unique id, PCI address and VRAM size, from the world in
 * world.h, re-read at every amdsmi_init so a driver change under a live box shows on the next
 * init. A missing or malformed world fails amdsmi_init with AMDSMI_STATUS_DRIVER_NOT_LOADED
 * (amdgpu not loaded); while the file $SANDBOX_AMDSMI_HANG names exists, amdsmi_init does not
 * return (a wedged GPU or driver, as the stand-in NVML's hang).
 */
#include <stdint.h>
#include <unistd.h>

#include "world.h"

#define EXPORT __attribute__((visibility("default")))

typedef uint32_t amdsmi_status_t;

enum {
    AMDSMI_STATUS_SUCCESS = 0,
    AMDSMI_STATUS_INVAL = 1,
    AMDSMI_STATUS_NOT_SUPPORTED = 2,
    AMDSMI_STATUS_NOT_INIT = 32,
    AMDSMI_STATUS_DRIVER_NOT_LOADED = 34,
    AMDSMI_STATUS_INSUFFICIENT_SIZE = 41,
};

enum { AMDSMI_INIT_AMD_GPUS = 2, AMDSMI_PROCESSOR_TYPE_AMD_GPU = 1, AMDSMI_MEM_TYPE_VRAM = 0 };

static amd_world_t world;
static int init_count;
static int socket_token;  /* one socket: its handle is this address */

typedef amd_device_t *amdsmi_processor_handle;
typedef void *amdsmi_socket_handle;

#define REQUIRE_INIT() do { if (init_count <= 0) return AMDSMI_STATUS_NOT_INIT; } while (0)
#define REQUIRE_GPU(h) do { REQUIRE_INIT(); if (!valid_gpu(h)) return AMDSMI_STATUS_INVAL; } while (0)

static int valid_gpu(amdsmi_processor_handle h) {
    return h >= world.devices && h < world.devices + world.count;
}

static void copy_text(char *dst, const char *src, size_t cap) {
    strncpy(dst, src, cap - 1);
    dst[cap - 1] = '\0';
}

/* ---------------------------------------------------------------- init / shutdown */

static void hang_while_asked(void) {
    const char *path = getenv("SANDBOX_AMDSMI_HANG");
    if (!path || !*path) return;
    while (access(path, F_OK) == 0) usleep(50000);
}

EXPORT amdsmi_status_t amdsmi_init(uint64_t flags) {
    static amd_world_t fresh;
    hang_while_asked();
    if (!(flags & AMDSMI_INIT_AMD_GPUS)) return AMDSMI_STATUS_INVAL;  /* only GPUs are modelled */
    if (!load_amd_world(&fresh)) return AMDSMI_STATUS_DRIVER_NOT_LOADED;
    world = fresh;
    init_count++;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_shut_down(void) {
    REQUIRE_INIT();
    init_count--;
    return AMDSMI_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- handles */

/* Both list calls: a NULL list asks for the count; otherwise up to *count are filled. */
EXPORT amdsmi_status_t amdsmi_get_socket_handles(uint32_t *count, amdsmi_socket_handle *list) {
    REQUIRE_INIT();
    if (!count) return AMDSMI_STATUS_INVAL;
    unsigned have = world.count ? 1 : 0;
    if (!list) { *count = have; return AMDSMI_STATUS_SUCCESS; }
    if (*count < have) return AMDSMI_STATUS_INSUFFICIENT_SIZE;
    if (have) list[0] = &socket_token;
    *count = have;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle socket, uint32_t *count,
                                                    amdsmi_processor_handle *list) {
    REQUIRE_INIT();
    if (!count || socket != (amdsmi_socket_handle)&socket_token) return AMDSMI_STATUS_INVAL;
    if (!list) { *count = world.count; return AMDSMI_STATUS_SUCCESS; }
    if (*count < world.count) return AMDSMI_STATUS_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < world.count; i++) list[i] = &world.devices[i];
    *count = world.count;
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_processor_type(amdsmi_processor_handle h, uint32_t *type) {
    REQUIRE_GPU(h);
    if (!type) return AMDSMI_STATUS_INVAL;
    *type = AMDSMI_PROCESSOR_TYPE_AMD_GPU;
    return AMDSMI_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- identity */

typedef struct {
    char driver_version[TEXT_LEN];
    char driver_date[TEXT_LEN];
    char driver_name[TEXT_LEN];
} amdsmi_driver_info_t;

EXPORT amdsmi_status_t amdsmi_get_gpu_driver_info(amdsmi_processor_handle h,
                                                  amdsmi_driver_info_t *info) {
    REQUIRE_GPU(h);
    if (!info) return AMDSMI_STATUS_INVAL;
    memset(info, 0, sizeof *info);
    copy_text(info->driver_version, world.driver_version, TEXT_LEN);
    copy_text(info->driver_name, "amdgpu", TEXT_LEN);
    return AMDSMI_STATUS_SUCCESS;
}

typedef struct {
    char market_name[TEXT_LEN];
    uint32_t vendor_id;
    char vendor_name[TEXT_LEN];
    uint32_t subvendor_id;
    uint64_t device_id;
    uint32_t rev_id;
    char asic_serial[TEXT_LEN];
    uint32_t oam_id;
    uint32_t num_of_compute_units;
    uint64_t target_graphics_version;
    uint32_t subsystem_id;
    uint32_t reserved[21];
} amdsmi_asic_info_t;

EXPORT amdsmi_status_t amdsmi_get_gpu_asic_info(amdsmi_processor_handle h, amdsmi_asic_info_t *info) {
    REQUIRE_GPU(h);
    if (!info) return AMDSMI_STATUS_INVAL;
    memset(info, 0, sizeof *info);
    copy_text(info->market_name, h->name, TEXT_LEN);
    info->vendor_id = 0x1002;  /* AMD; the device id and the rest are not modelled */
    copy_text(info->vendor_name, "Advanced Micro Devices Inc. [AMD/ATI]", TEXT_LEN);
    info->oam_id = UINT32_MAX;
    info->num_of_compute_units = UINT32_MAX;
    info->subvendor_id = UINT32_MAX;
    info->subsystem_id = UINT32_MAX;
    return AMDSMI_STATUS_SUCCESS;
}

typedef struct {
    char model_number[TEXT_LEN];
    char product_serial[TEXT_LEN];
    char fru_id[TEXT_LEN];
    char product_name[TEXT_LEN];
    char manufacturer_name[TEXT_LEN];
    uint64_t reserved[64];
} amdsmi_board_info_t;

EXPORT amdsmi_status_t amdsmi_get_gpu_board_info(amdsmi_processor_handle h,
                                                 amdsmi_board_info_t *info) {
    REQUIRE_GPU(h);
    if (!info) return AMDSMI_STATUS_INVAL;
    memset(info, 0, sizeof *info);
    copy_text(info->product_serial, h->serial, TEXT_LEN);
    copy_text(info->product_name, h->name, TEXT_LEN);
    copy_text(info->manufacturer_name, "AMD", TEXT_LEN);
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_gpu_device_uuid(amdsmi_processor_handle h, uint32_t *len,
                                                  char *uuid) {
    REQUIRE_GPU(h);
    if (!len || !uuid) return AMDSMI_STATUS_INVAL;
    size_t need = strlen(h->uuid) + 1;
    if (*len < need) { *len = (uint32_t)need; return AMDSMI_STATUS_INSUFFICIENT_SIZE; }
    memcpy(uuid, h->uuid, need);
    *len = (uint32_t)need;
    return AMDSMI_STATUS_SUCCESS;
}

/* amdsmi_bdf_t: function:3, device:5, bus:8, domain:48, low bits first */
EXPORT amdsmi_status_t amdsmi_get_gpu_device_bdf(amdsmi_processor_handle h, uint64_t *bdf) {
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    REQUIRE_GPU(h);
    if (!bdf) return AMDSMI_STATUS_INVAL;
    if (sscanf(h->pci_bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
        return AMDSMI_STATUS_NOT_SUPPORTED;
    *bdf = ((uint64_t)domain << 16) | ((uint64_t)(bus & 0xFF) << 8) | ((dev & 0x1F) << 3) | (fn & 7);
    return AMDSMI_STATUS_SUCCESS;
}

EXPORT amdsmi_status_t amdsmi_get_gpu_memory_total(amdsmi_processor_handle h, uint32_t type,
                                                   uint64_t *total) {
    REQUIRE_GPU(h);
    if (!total) return AMDSMI_STATUS_INVAL;
    if (type != AMDSMI_MEM_TYPE_VRAM) return AMDSMI_STATUS_NOT_SUPPORTED;
    *total = h->memory_total;
    return AMDSMI_STATUS_SUCCESS;
}

/*
 * Stand-in libnvidia-ml.so.1 for the sandbox.
 *
 * Loaded unchanged by nvidia-ml-py (module pynvml). It answers the calls the agent and the
 * facts make (init, driver and CUDA versions, devices and their identity, memory, temperature,
 * utilisation) from a JSON file named by $SANDBOX_NVML_CONFIG (default /etc/sandbox-nvml.json),
 * re-read at every nvmlInit so a driver change under a live box shows on the next init.
 * Every other symbol pynvml may look up answers NVML_ERROR_NOT_SUPPORTED (stubs.c).
 *
 * JSON shape (dataclasses.asdict(sandbox.backend.GpuSpec)):
 *   {"driver_version": "580.95.05", "cuda_driver_version": 12080,
 *    "devices": [{"uuid": "GPU-...", "name": "...", "pci_bus_id": "00000000:1B:00.0",
 *                 "memory_total": 85899345920, "serial": "1650..." | null}]}
 * Optional per device: memory_used, temperature_c, utilization_gpu, utilization_memory.
 * A missing, unreadable or malformed file makes nvmlInit fail with NVML_ERROR_DRIVER_NOT_LOADED.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_DEVICES 64
#define DRIVER_LEN 80
#define UUID_LEN 96
#define NAME_LEN 96
#define SERIAL_LEN 30
#define PCI_LEN 32
#define PCI_LEGACY_LEN 16

typedef struct {
    char uuid[UUID_LEN];
    char name[NAME_LEN];
    char pci_bus_id[PCI_LEN];
    char serial[SERIAL_LEN];
    int has_serial;
    unsigned long long memory_total;
    unsigned long long memory_used;
    unsigned int temperature_c;
    unsigned int utilization_gpu;
    unsigned int utilization_memory;
} device_t;

typedef struct {
    char driver_version[DRIVER_LEN];
    int cuda_driver_version;
    unsigned int count;
    device_t devices[MAX_DEVICES];
} world_t;

static world_t world;
static int init_count;

#include "jsonread.h"

static int device_member(reader_t *r, const char *key, void *ctx) {
    device_t *d = ctx;
    if (!strcmp(key, "uuid")) read_string(r, d->uuid, sizeof d->uuid);
    else if (!strcmp(key, "name")) read_string(r, d->name, sizeof d->name);
    else if (!strcmp(key, "pci_bus_id")) read_string(r, d->pci_bus_id, sizeof d->pci_bus_id);
    else if (!strcmp(key, "serial")) {
        if (read_literal(r, "null")) d->has_serial = 0;
        else { read_string(r, d->serial, sizeof d->serial); d->has_serial = 1; }
    }
    else if (!strcmp(key, "memory_total")) d->memory_total = (unsigned long long)read_int(r);
    else if (!strcmp(key, "memory_used")) d->memory_used = (unsigned long long)read_int(r);
    else if (!strcmp(key, "temperature_c")) d->temperature_c = (unsigned)read_int(r);
    else if (!strcmp(key, "utilization_gpu")) d->utilization_gpu = (unsigned)read_int(r);
    else if (!strcmp(key, "utilization_memory")) d->utilization_memory = (unsigned)read_int(r);
    else return 0;
    return 1;
}

static void read_device(reader_t *r, void *slot) {
    device_t *d = slot;
    memset(d, 0, sizeof *d);
    d->temperature_c = 35;
    read_object(r, device_member, d);
}

typedef struct {
    world_t *w;
    int have_driver;
} world_read_t;

static int world_member(reader_t *r, const char *key, void *ctx) {
    world_read_t *c = ctx;
    if (!strcmp(key, "driver_version")) {
        read_string(r, c->w->driver_version, sizeof c->w->driver_version);
        c->have_driver = 1;
    } else if (!strcmp(key, "cuda_driver_version")) {
        c->w->cuda_driver_version = (int)read_int(r);
    } else if (!strcmp(key, "devices")) {
        read_array(r, read_device, c->w->devices, sizeof c->w->devices[0], MAX_DEVICES,
                   &c->w->count);
    } else {
        return 0;
    }
    return 1;
}

static int parse_world(const char *text, size_t len, world_t *w) {
    world_read_t c = {w, 0};
    memset(w, 0, sizeof *w);
    return read_document(text, len, world_member, &c) && c.have_driver;
}

static int load_world(void) {
    const char *path = getenv("SANDBOX_NVML_CONFIG");
    if (!path || !*path) path = "/etc/sandbox-nvml.json";
    size_t len;
    char *text = read_whole_file(path, &len);
    if (!text) return 0;
    static world_t fresh;
    int ok = parse_world(text, len, &fresh);
    free(text);
    if (ok) world = fresh;
    return ok;
}

/* ---------------------------------------------------------------- helpers */

typedef device_t *nvmlDevice_t;

static int valid_device(nvmlDevice_t d) {
    return d >= world.devices && d < world.devices + world.count;
}

#define REQUIRE_INIT() do { if (init_count <= 0) return NVML_ERROR_UNINITIALIZED; } while (0)
#define REQUIRE_DEVICE(d) do { REQUIRE_INIT(); if (!valid_device(d)) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

static nvmlReturn_t copy_out(const char *value, char *buf, unsigned int len) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, value);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- init / shutdown */

/* A driver call that hangs: while the file SANDBOX_NVML_HANG names exists, init does not
 * return (a wedged GPU or driver, as seen on real hosts). */
static void hang_while_asked(void) {
    const char *path = getenv("SANDBOX_NVML_HANG");
    if (!path || !*path) return;
    while (access(path, F_OK) == 0) usleep(50000);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    hang_while_asked();
    if (!load_world()) return NVML_ERROR_DRIVER_NOT_LOADED;
    init_count++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    REQUIRE_INIT();
    init_count--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---------------------------------------------------------------- system */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    REQUIRE_INIT();
    return copy_out(world.driver_version, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char text[DRIVER_LEN + 16];
    REQUIRE_INIT();
    snprintf(text, sizeof text, "%d.%s", world.cuda_driver_version / 1000, world.driver_version);
    return copy_out(text, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cuda) {
    REQUIRE_INIT();
    if (!cuda) return NVML_ERROR_INVALID_ARGUMENT;
    *cuda = world.cuda_driver_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cuda) {
    return nvmlSystemGetCudaDriverVersion(cuda);
}

/* ---------------------------------------------------------------- devices */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    REQUIRE_INIT();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = world.count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (!device || index >= world.count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &world.devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < world.count; i++) {
        if (!strcmp(world.devices[i].uuid, uuid)) {
            *device = &world.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (!serial || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < world.count; i++) {
        if (world.devices[i].has_serial && !strcmp(world.devices[i].serial, serial)) {
            *device = &world.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    REQUIRE_INIT();
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < world.count; i++) {
        if (!strcasecmp(world.devices[i].pci_bus_id, bus_id)) {
            *device = &world.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    REQUIRE_DEVICE(device);
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)(device - world.devices);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    REQUIRE_DEVICE(device);
    return copy_out(device->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    REQUIRE_DEVICE(device);
    return copy_out(device->name, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    REQUIRE_DEVICE(device);
    if (!device->has_serial) return NVML_ERROR_NOT_SUPPORTED;
    return copy_out(device->serial, serial, length);
}

/* nvmlPciInfo_t as of NVML 9.0 (what nvmlDeviceGetPciInfo_v3 fills). */
typedef struct {
    char busIdLegacy[PCI_LEGACY_LEN];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[PCI_LEN];
} nvmlPciInfo_t;

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    REQUIRE_DEVICE(device);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    /* "00000000:1B:00.0": domain:bus:device.function, all hex */
    sscanf(device->pci_bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010DE;  /* vendor 0x10DE (NVIDIA); the device id is not modelled */
    strncpy(pci->busId, device->pci_bus_id, PCI_LEN - 1);
    snprintf(pci->busIdLegacy, PCI_LEGACY_LEN, "%04X:%02X:%02X.%X", domain & 0xFFFF, bus, dev, fn);
    return NVML_SUCCESS;
}

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2 0x02000028u

static unsigned long long used_of(const device_t *d) {
    return d->memory_used > d->memory_total ? d->memory_total : d->memory_used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    REQUIRE_DEVICE(device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = device->memory_total;
    memory->used = used_of(device);
    memory->free = device->memory_total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    REQUIRE_DEVICE(device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->memory_total;
    memory->reserved = 0;
    memory->used = used_of(device);
    memory->free = device->memory_total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    REQUIRE_DEVICE(device);
    if (!temp) return NVML_ERROR_INVALID_ARGUMENT;
    if (sensor != 0) return NVML_ERROR_NOT_SUPPORTED;  /* only NVML_TEMPERATURE_GPU exists */
    *temp = device->temperature_c;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    REQUIRE_DEVICE(device);
    if (!util) return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = device->utilization_gpu;
    util->memory = device->utilization_memory;
    return NVML_SUCCESS;
}

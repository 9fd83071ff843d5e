/*
 * The world the sandbox's stand-in AMD libraries report (libamd_smi.so, librocm-core.so): a
 * JSON file named by $SANDBOX_AMDSMI_CONFIG (default /run/sandbox/amdsmi.json, the box's
 * read-only sys dir), re-read at every amdsmi_init and every getROCmVersion, so a change under
 * a live box (driver drift) shows on the next call.
 *
 * JSON shape (dataclasses.asdict(sandbox.backend.GpuSpec) with vendor "amd"):
 *   {"driver_version": "6.12.12", "rocm_version": "6.4.1",
 *    "devices": [{"uuid": "...", "name": "AMD Instinct MI300X", "pci_bus_id": "0000:1B:00.0",
 *                 "memory_total": 206141652992, "serial": "..." | null}]}
 * A missing, unreadable or malformed file is an amdgpu driver that is not loaded.
 */
#ifndef SANDBOX_AMD_WORLD_H
#define SANDBOX_AMD_WORLD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonread.h"

#define MAX_DEVICES 64
#define TEXT_LEN 256  /* the library's AMDSMI_MAX_STRING_LENGTH */
#define UUID_LEN 38   /* AMDSMI_GPU_UUID_SIZE */

typedef struct {
    char uuid[UUID_LEN];
    char name[TEXT_LEN];
    char pci_bus_id[32];
    char serial[TEXT_LEN];
    unsigned long long memory_total;
} amd_device_t;

typedef struct {
    char driver_version[TEXT_LEN];
    char rocm_version[64];
    unsigned int count;
    amd_device_t devices[MAX_DEVICES];
} amd_world_t;

static int amd_device_member(reader_t *r, const char *key, void *ctx) {
    amd_device_t *d = ctx;
    if (!strcmp(key, "uuid")) read_string(r, d->uuid, sizeof d->uuid);
    else if (!strcmp(key, "name")) read_string(r, d->name, sizeof d->name);
    else if (!strcmp(key, "pci_bus_id")) read_string(r, d->pci_bus_id, sizeof d->pci_bus_id);
    else if (!strcmp(key, "serial")) {
        if (!read_literal(r, "null")) read_string(r, d->serial, sizeof d->serial);
    }
    else if (!strcmp(key, "memory_total")) d->memory_total = (unsigned long long)read_int(r);
    else return 0;
    return 1;
}

static void read_amd_device(reader_t *r, void *slot) {
    amd_device_t *d = slot;
    memset(d, 0, sizeof *d);
    read_object(r, amd_device_member, d);
}

typedef struct {
    amd_world_t *w;
    int have_driver;
} amd_world_read_t;

static int amd_world_member(reader_t *r, const char *key, void *ctx) {
    amd_world_read_t *c = ctx;
    if (!strcmp(key, "driver_version")) {
        read_string(r, c->w->driver_version, sizeof c->w->driver_version);
        c->have_driver = 1;
    } else if (!strcmp(key, "rocm_version")) {
        if (!read_literal(r, "null")) read_string(r, c->w->rocm_version, sizeof c->w->rocm_version);
    } else if (!strcmp(key, "devices")) {
        read_array(r, read_amd_device, c->w->devices, sizeof c->w->devices[0], MAX_DEVICES,
                   &c->w->count);
    } else {
        return 0;
    }
    return 1;
}

static int parse_amd_world(const char *text, size_t len, amd_world_t *w) {
    amd_world_read_t c = {w, 0};
    memset(w, 0, sizeof *w);
    return read_document(text, len, amd_world_member, &c) && c.have_driver;
}

/* Reads the configured world into *w; 0 when there is none to read (amdgpu not loaded). */
static int load_amd_world(amd_world_t *w) {
    const char *path = getenv("SANDBOX_AMDSMI_CONFIG");
    if (!path || !*path) path = "/run/sandbox/amdsmi.json";
    size_t len;
    char *text = read_whole_file(path, &len);
    if (!text) return 0;
    int ok = parse_amd_world(text, len, w);
    free(text);
    return ok;
}

#endif

/*
 * Stand-in librocm-core.so: the one call amdsmi's amdsmi_get_rocm_version makes,
 * getROCmVersion, answering the configured rocm_version ("6.4.1") as major, minor, patch.
 * Real ROCm compiles its release into this library; here it is the world's (see world.h).
 */
#include "world.h"

#define EXPORT __attribute__((visibility("default")))

enum { VerSuccess = 0, VerErrorInvalidArgs = 1 };

EXPORT unsigned int getROCmVersion(unsigned int *major, unsigned int *minor, unsigned int *patch) {
    static amd_world_t world;
    unsigned int a, b, c;
    char tail;
    if (!major || !minor || !patch) return VerErrorInvalidArgs;
    if (!load_amd_world(&world)) return VerErrorInvalidArgs;
    if (sscanf(world.rocm_version, "%u.%u.%u%c", &a, &b, &c, &tail) != 3) return VerErrorInvalidArgs;
    *major = a;
    *minor = b;
    *patch = c;
    return VerSuccess;
}

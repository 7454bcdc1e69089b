/* What the AMX kernels (bf16_linear_amx.c, q8a_coded_linear_amx.c) share: the tile configuration's
 * memory layout (LDTILECFG's 64 bytes, palette 1) and the one-time request for the tile data state.
 * Linux hands a process the AMX register state only when it asks, arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA) (Linux >= 5.16); without the grant the first tile instruction faults. The
 * grant is per process and idempotent; each kernel keeps its own flag of having asked. */
#ifndef HETERO_AMX_TILES_H
#define HETERO_AMX_TILES_H

#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tile_config;

/* 0 when this process holds the tile data state (asked now, or before), -1 when Linux refuses it. */
static inline int amx_tile_permission(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : -1;
}

#endif

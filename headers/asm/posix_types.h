/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* See asm/types.h for why this shim exists. */
#ifndef KVGATE_ASM_POSIX_TYPES_H
#define KVGATE_ASM_POSIX_TYPES_H
#include <asm-generic/posix_types.h>
#endif

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* BPF is a 64-bit target; see asm/types.h for why this shim exists. */
#ifndef KVGATE_ASM_BITSPERLONG_H
#define KVGATE_ASM_BITSPERLONG_H
#define __BITS_PER_LONG 64
#include <asm-generic/bitsperlong.h>
#endif

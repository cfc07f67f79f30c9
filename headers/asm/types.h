/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * <linux/bpf.h> reaches <asm/types.h>, which Debian keeps under the host's
 * multiarch directory (/usr/include/x86_64-linux-gnu/asm, ...), a path
 * clang -target bpf does not search. Every Linux architecture's asm/types.h
 * is asm-generic's, so this shim makes the BPF build independent of the
 * build host. See pkg/splice/gen.go.
 */
#ifndef KVGATE_ASM_TYPES_H
#define KVGATE_ASM_TYPES_H
#include <asm-generic/types.h>
#endif

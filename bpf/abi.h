/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Clang writes BTF only for the types a kept symbol uses, and an enum that only names constants (limits, stat
 * indices, flags) is used by none. NS_ABI_KEEP(tag) declares one read-only variable of `struct tag`, whose
 * members name each such type, so src/netsleuth/bpf/abigen.py finds every enum and struct userspace mirrors
 * in the object's own BTF. It costs a few bytes of .rodata and nothing at run time.
 */
#ifndef NETSLEUTH_ABI_H
#define NETSLEUTH_ABI_H

#define NS_ABI_KEEP(tag) const volatile struct tag tag = {}

#endif /* NETSLEUTH_ABI_H */

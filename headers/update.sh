#!/bin/sh
# Regenerates the BPF headers from the running kernel and Debian's libbpf-dev.
# Needs: bpftool, libbpf-dev (headers under /usr/include/bpf), a kernel with BTF.
# Run from anywhere; writes next to this script. Commit the result.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
btf=${BTF:-/sys/kernel/btf/vmlinux}
bpftool btf dump file "$btf" format c >"$here/vmlinux.h.tmp"
mv "$here/vmlinux.h.tmp" "$here/vmlinux.h"
for f in bpf_helpers.h bpf_helper_defs.h bpf_endian.h bpf_core_read.h bpf_tracing.h; do
	cp "/usr/include/bpf/$f" "$here/$f"
done
echo "headers updated from $(uname -r) and $(dpkg-query -W -f='libbpf-dev ${Version}' libbpf-dev 2>/dev/null || echo 'libbpf headers')"

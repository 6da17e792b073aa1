"""Built from bpf/ by `make bpf`: the BPF objects (*.bpf.o) and the Python ABI generated from their BTF."""

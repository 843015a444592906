"""The refusal of buffers on two GPUs, as every route words it: shared by the simulator's table
(``tests/safety/test_mixed_devices.py``, devices faked) and the two-GPU one (``tests/target/test_gpu_multi.py``)."""

TWO = r": kvnumba copies within one GPU \(and pinned host memory\); move the buffers to one device"


def first_on(layers):
    """route -> how it names the first buffer on each card: (source, destination, the split side's other)."""
    return {
        "kernel": ("src_k", "dst_k", "dst_v"),
        "staged": (None, "dst_k", "dst_v"),
        "direct": (r"src_layers\[0\]", r"dst_layers\[0\]", rf"dst_layers\[{layers - 1}\]"),
        "direct_pf_lf": (None, r"dst_ptrs\[0\]", r"dst_ptrs\[1\]"),
        "copy": (r"src_view\.k", r"dst_view\.k", r"dst_view\.v"),
        "copy_engine": (r"src_view\.k", r"dst_view\.k", r"dst_view\.v"),
        "prepared": (r"src_view\.k", r"dst_view\.k", r"dst_view\.v"),
        "fp8": (r"src_view\.k", r"dst_view\.codes\.k", r"src_view\.k"),
        "lanes": (r"src_view\.k", r"dst_view\.k", r"dst_view\.v"),
    }


def expected(route, case, layers):
    """The message (a regular expression) of a call on ``route`` whose arguments are placed as ``case`` says."""
    src, dst, other = first_on(layers)[route]
    if case == "src0_dst1":
        return rf"{src} is on cuda:0 but {dst} is on cuda:1{TWO}"
    if case == "src1_dst0":
        return rf"{src} is on cuda:1 but {dst} is on cuda:0{TWO}"
    if case == "split":
        if route == "direct_pf_lf":  # dst_ptrs[0] alone on cuda:0
            return rf"{dst} is on cuda:0 but {other} is on cuda:1{TWO}"
        if route == "fp8":  # the source and the codes on cuda:1, the scales on cuda:0
            return rf"src_view\.k is on cuda:1 but dst_view\.scales\.k is on cuda:0{TWO}"
        first = src if src is not None else dst
        return rf"{first} is on cuda:1 but {other} is on cuda:0{TWO}"
    if case == "indices":
        return r"src_indices is on cuda:0 but the buffers are on cuda:1"
    return r"stream is on cuda:0 but the buffers are on cuda:1: pass a stream of cuda:1"

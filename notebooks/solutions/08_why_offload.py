"""Solutions to the exercises of notebooks/08_why_offload.ipynb; ``python notebooks/solutions/08_why_offload.py``
prints them and checks each (tests/test_notebooks.py runs it)."""


def exercise_1():
    """Qwen2.5-7B: 28 layers x 4 KV heads x 128 numbers x 2 (K and V) x 2 bytes (bf16) = 57,344 bytes a token,
    56 KiB: fewer KV heads than Llama-3.1-8B's 8, so under half its 128 KiB."""
    layers, kv_heads, head_dim, k_and_v, bf16 = 28, 4, 128, 2, 2
    answer = layers * kv_heads * head_dim * k_and_v * bf16
    assert answer == 57_344 and answer * 2 < 32 * 8 * 128 * 2 * 2
    return answer


def serial_ms(a, b, layers):
    """One stream: every load, then its layer's compute, one after the other."""
    return layers * (a + b)


def overlapped_ms(a, b, layers):
    """A load stream ahead of the compute: the first load, then per layer the slower of the next load and this
    layer's compute (the loads run back to back; layer l starts when its load is in and layer l - 1 is done),
    then the last compute: ``a + (L - 1) * max(a, b) + b``."""
    return a + (layers - 1) * max(a, b) + b


def _simulated(a, b, layers):
    """The same by stepping through the two streams event by event."""
    load_end = [a * (l + 1) for l in range(layers)]  # loads back to back on their stream
    end = 0.0
    for l in range(layers):
        end = max(end, load_end[l]) + b
    return end


if __name__ == "__main__":
    print(f"exercise 1: {exercise_1():,} bytes a token")
    for a, b in ((1.0, 2.0), (2.0, 1.0), (0.5, 0.5)):
        assert abs(overlapped_ms(a, b, 32) - _simulated(a, b, 32)) < 1e-9
        print(f"exercise 2: a={a} b={b}, 32 layers: serial {serial_ms(a, b, 32)} ms, overlapped {overlapped_ms(a, b, 32)} ms")

"""Solution to the exercise of notebooks/01_layouts.ipynb; ``python notebooks/solutions/01_layouts.py`` prints it
and checks it against the kernels' address functions and the oracle (tests/test_notebooks.py runs it)."""
import numpy as np

import kvnumba
from kvnumba import reference
from kvnumba.kernels.layouts import address


def head_3_of_token_37_in_layer_2():
    """Page-head is ``(T // P, H, P, L, D)``: 32 layers, pages of 16, 8 heads of 256 bytes.

    - token 37 is in page 37 // 16 = 2, slot 37 % 16 = 5;
    - one page holds H x P x L heads' rows: 8 x 16 x 32 x 256 = 1,048,576 bytes, so page 2 starts at 2,097,152;
    - within the page, head 3 starts 3 x (16 x 32 x 256) = 393,216 bytes on;
    - within the head, slot 5 is 5 x (32 x 256) = 40,960 on, and layer 2 is 2 x 256 = 512 further:
      2,097,152 + 393,216 + 40,960 + 512 = 2,531,840.
    """
    layers, page, heads, head_bytes = 32, 16, 8, 256
    token, layer, head = 37, 2, 3
    page_bytes = heads * page * layers * head_bytes
    offset = (token // page * page_bytes + head * page * layers * head_bytes + token % page * layers * head_bytes
              + layer * head_bytes)
    item, dim = heads * head_bytes, layers * heads * head_bytes
    assert offset == 2_531_840
    assert offset == address(kvnumba.PageHead.parts, 0, layer, dim, token, item, head, heads, page)
    assert offset == reference.page_head_offsets(np.array([token]), layer, head, item, dim, page, heads)[0]
    return offset


if __name__ == "__main__":
    print(f"head 3 of token 37 in layer 2 begins at byte {head_3_of_token_37_in_layer_2():,}")

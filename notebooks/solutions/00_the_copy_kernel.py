"""Solutions to the exercises of notebooks/00_the_copy_kernel.ipynb; ``python notebooks/solutions/00_the_copy_kernel.py``
prints them and checks each against what kvnumba computes (tests/test_notebooks.py runs it)."""
from kvnumba.driver.launch import launch_shape

SECTOR, WARP = 32, 32


def exercise_1():
    """The chunked order: lane i moves bytes [64i, 64i + 64), one 8-byte word a step.

    At one step the lanes' addresses are 64 bytes apart, so each lane's word lies in a sector of its own:
    32 sectors for 256 bytes, where the kernel's order (lane i moves words i, i + 32, ...) touches 8. Of each
    32-byte sector the step uses 8 bytes: a quarter. (The next steps reuse those sectors only if they are
    still in a cache; the kernel's stores, st.global.cg, skip L1.)
    """
    sectors = 32                      # one a lane: 64 bytes apart > 32
    share = 8 / SECTOR
    # check against the addresses themselves
    for step in range(8):
        touched = {(64 * lane + 8 * step) // SECTOR for lane in range(WARP)}
        assert len(touched) == sectors
        assert WARP * 8 / (SECTOR * len(touched)) == share
    return sectors, share


def exercise_2():
    """1000 items, block_quota=4, 32 warps a block.

    At most 4 blocks x 32 warps = 128 warps share 1000 items: ceil(1000 / 128) = 8 items a warp. The 1000 items
    then need ceil(1000 / 8) = 125 warps, in ceil(125 / 32) = 4 blocks; the last block's last 3 warps
    (4 x 32 - 125) find ``count <= 0`` and return at once.
    """
    items_per_warp, blocks, idle = 8, 4, 3
    got_items, got_blocks, threads = launch_shape(1000, 4, 32)
    busy = -(-1000 // got_items)
    assert (got_items, got_blocks, got_blocks * 32 - busy, threads) == (items_per_warp, blocks, idle, 1024)
    return items_per_warp, blocks, idle


if __name__ == "__main__":
    sectors, share = exercise_1()
    print(f"exercise 1: the chunked order touches {sectors} sectors a step and uses {share:.0%} of each")
    print("exercise 2: {} items a warp, {} blocks, {} idle warps".format(*exercise_2()))

"""Lesson 05's exercises, solved. Try them in the notebook first."""


# %% Exercise 05.1: budgets for a given map
def budgets_for_goal(sizes: dict[str, int]) -> dict:
    """GPU 0 holds back room for the largest layer still to place (a main device, Step 4);
    GPU 1 does not. The CPU, a main device for disk layers, gets the head and a reserve."""
    blocks = sorted((n for n in sizes if n.startswith("blocks.") and n.count(".") == 1),
                    key=lambda n: int(n.split(".")[1]))
    half = len(blocks) // 2
    largest = max(sizes["embed"], sizes["head"], sizes[blocks[0]])
    gpu0 = sizes["embed"] + sum(sizes[b] for b in blocks[:half]) + largest
    gpu1 = sum(sizes[b] for b in blocks[half:]) + sizes["norm"]
    return {0: gpu0, 1: gpu1, "cpu": sizes["head"] + largest}


# %% Exercise 05.2: bytes copied per forward
def copied_per_forward(device_map: dict, sizes: dict[str, int]) -> int:
    """Every module mapped to the CPU or the disk is brought to GPU 0 for each forward."""
    return sum(sizes[name] for name, device in device_map.items() if device in ("cpu", "disk"))


# %% Exercise 05.3: why hold back room for the largest layer
def gpu0_peak(device_map: dict, sizes: dict[str, int]) -> int:
    """GPU 0 keeps its own layers all along; an offloaded layer is copied in for its turn and
    dropped after it, so at its fullest GPU 0 holds its layers plus the largest offloaded one."""
    home = sum(sizes[name] for name, device in device_map.items() if device == 0)
    away = [sizes[name] for name, device in device_map.items() if device in ("cpu", "disk")]
    return home + max(away, default=0)


ANSWERS = {"05.1": budgets_for_goal, "05.2": copied_per_forward, "05.3": gpu0_peak}

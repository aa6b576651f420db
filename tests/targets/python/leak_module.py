"""leak_here keeps what it makes (leak_service.py): 1,000 small dicts per call, which come from
pymalloc's arenas, not from malloc."""
LEAK_LINE = 9  # the line of the append below


def leak_here(held):
    for i in range(1000):
        # kept for good
        held.append({"n": i, "name": f"item-{i}"})

"""leak_here keeps what it makes (leak_service.py)."""
LEAK_LINE = 8  # the line of the append below


def leak_here(held):
    for i in range(1000):
        # kept for good
        held.append(bytes(1000 + i % 7))

"""write_all: a file object that writes less than asked (a buffered file's write() of more than
2 GiB writes 2 GiB - 4 KiB) is written to until everything is out."""
from memhook.capture import private_file


class ShortWrites:
    """Takes at most 7 bytes a call, as write(2) may take fewer than asked."""

    def __init__(self):
        self.out = bytearray()

    def write(self, data) -> int:
        self.out += bytes(data[:7])
        return min(len(data), 7)


def test_write_all_writes_what_a_short_write_left():
    f = ShortWrites()
    data = bytes(range(256)) * 3
    private_file.write_all(f, data)
    assert bytes(f.out) == data

"""memhook: attach to a running C/C++ process and find the call stacks that hold unfreed memory."""
import os

# numpy's OpenBLAS starts a thread per CPU that spins after each call; on the host being profiled
# memhook takes no CPU it does not need (nothing here multiplies matrices).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"

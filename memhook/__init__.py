"""memhook: attach to a running C/C++ process and find the call stacks that hold unfreed memory."""
__version__ = "0.1.0"

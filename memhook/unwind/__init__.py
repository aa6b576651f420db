"""The unwind rows the hook library walks stacks with (hook_cpp/unwind/): tables builds them per
object from its call-frame information, prologue_rows from machine code where it has none."""

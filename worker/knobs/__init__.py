"""How each setting is applied to the machine or the child's start, read back and restored."""

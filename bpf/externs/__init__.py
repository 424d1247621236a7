"""Extern symbols of an object: `.kconfig` values, `__ksym` variables and kfuncs."""

"""CPython's memory layouts, per version, as data for the Python frame walker
(catalog/programs/gfx_python.h)."""

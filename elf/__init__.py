"""The one ELF layer: every module that reads an ELF file reads it here. A BPF
object (relocatable.py) is read with pyelftools, imported on first use; the
shared libraries and executables a uprobe attach and a profile read (their
headers, notes, symbol tables and .eh_frame bytes) through the measured fast
path, reader.py."""

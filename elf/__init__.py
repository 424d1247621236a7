"""The one ELF layer: every module that reads an ELF file (the BPF loader,
uprobe symbols, USDT notes, the profile's symbols, build-ids and unwind
tables, the vDSO image) reads it through gfxbpf.elf.reader."""

"""BTF: parsing, the type table, decoding values, encoding, .BTF.ext, `.maps`, the kernel's BTF."""

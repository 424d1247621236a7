/work/wt-memory/catalog/programs/xid.bpf.o: catalog/programs/xid.bpf.c \
  catalog/programs/gfxbpf.h /usr/include/linux/types.h \
  /usr/include/x86_64-linux-gnu/asm/types.h \
  /usr/include/asm-generic/types.h /usr/include/asm-generic/int-ll64.h \
  /usr/include/x86_64-linux-gnu/asm/bitsperlong.h \
  /usr/include/asm-generic/bitsperlong.h \
  /usr/include/linux/posix_types.h /usr/include/linux/stddef.h \
  /usr/include/x86_64-linux-gnu/asm/posix_types.h \
  /usr/include/x86_64-linux-gnu/asm/posix_types_64.h \
  /usr/include/asm-generic/posix_types.h /usr/include/linux/bpf.h \
  /usr/include/linux/bpf_common.h /usr/include/bpf/bpf_helpers.h \
  /usr/include/bpf/bpf_helper_defs.h

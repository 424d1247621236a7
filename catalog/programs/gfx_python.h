/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Python frames of the current task, walked in the kernel (CPython 3.9+,
 * libpython linked into the executable or a shared libpython3.X.so).
 *
 * Who runs Python is decided per FILE, not per process: the broker fills
 * `py_files` with (device, inode) -> (where _PyRuntime is, layout index)
 * and `py_layouts` with CPython's structure offsets per version
 * (gfxbpf.catalog.python.layouts). A task whose mm->exe_file is such an
 * executable has its runtime at mm->start_code + runtime_off. A process of
 * a shared build is found by an address in libpython's code: its user ip,
 * else the first word of the top GFX_PY_SCAN_BYTES of its user stack that
 * lies in such a mapping (a return address into the interpreter, e.g. below
 * a ctypes call or a blocking system call), looked up with bpf_find_vma.
 * The runtime is then at the file's load address + runtime_off, remembered
 * per process in `py_procs` (a process with no such address in
 * GFX_PY_LIB_TRIES records counts as not Python).
 * From the runtime: the main interpreter, its thread
 * states (the one whose thread_id is this thread's pthread_self(), which on
 * x86-64 glibc is the fs base), the current frame and the chain of previous
 * frames. Each frame gives (code object address, instruction value, ENTRY
 * flag); the first time a (tgid, code) is met its names, first line and
 * line table are copied into `py_codes`, which the client reads.
 *
 * Callers must have checked gfx_task_ok() first: every address read here is
 * the current task's own user memory, so the walk reads nothing the stack
 * copy does not already hand over; an offset a client chose only picks
 * which of that memory is read.
 *
 * Use from a program: gfx_py_record() for the per-CPU record, gfx_py_walk()
 * to fill it, a time stamp in its `ts` that the record it goes with carries
 * too, gfx_py_send() to put it in a ring buffer.
 */
#ifndef GFX_PYTHON_H
#define GFX_PYTHON_H

#include "gfxbpf.h"
#include <bpf/bpf_core_read.h>

#define GFX_PY_FILES 16           /* interpreter files per attachment */
#define GFX_PY_LAYOUTS 16         /* layout slots (index from the broker) */
#define GFX_PY_MAX_FRAMES 128     /* the most Python frames per record */
#define GFX_PY_THREADS 64         /* thread states searched per interpreter */
#define GFX_PY_NONE 0xFFFFFFFFu   /* a field the version lacks */
#define GFX_PY_NAME 96            /* bytes of qualname copied */
#define GFX_PY_PATH 192           /* bytes of filename copied */
#define GFX_PY_TABLE 1024         /* bytes of line table copied */
#ifndef GFX_PY_CODES  /* code objects remembered (LRU; the client reads them at once) */
#define GFX_PY_CODES 1024
#endif

/* ustack_rec-compatible flag (gfx_ucopy.h): this record holds Python frames. */
#define GFX_UREC_PYTHON 16
/* py_rec.flags beside GFX_UREC_PYTHON */
#define GFX_PY_TRUNCATED 32       /* more frames than python_frames */
#define GFX_PY_MAIN 64            /* the main thread's frames: this thread ran none
				   * (GFX_PY_BORROW_MAIN, below) */
/* py_frame.flags: bit 0, and the code object's tag in bits 8-31 */
#define GFX_PYF_ENTRY 1           /* the last frame run by one C call of the eval loop */
#define GFX_PYF_TAG_SHIFT 8

/* py_counts indexes */
#define GFX_PYC_WALKED 0          /* records with at least one frame */
#define GFX_PYC_TRUNCATED 1       /* chains cut at python_frames */
#define GFX_PYC_NO_THREAD 2       /* a Python process's thread with no thread state found */
#define GFX_PYC_FAULT 3           /* a read of interpreter memory failed */
#define GFX_PYC_CODE_LOST 4       /* a code object not stored (copy failed) */
#define GFX_PYC_N 5

/* Python frames per record: the broker lowers it to the policy's cap. */
const volatile __u32 python_frames = 64;

/* gfxbpf.catalog.python.layouts.PyLayout.pack(): all u32. */
struct py_layout {
	__u32 version;  /* major << 8 | minor; 0: empty slot */
	__u32 runtime_interp_head;
	__u32 interp_tstate_head;
	__u32 tstate_next;
	__u32 tstate_thread_id;
	__u32 tstate_frame;
	__u32 cframe_current_frame;
	__u32 frame_kind;  /* 0 PyFrameObject, 1 _PyInterpreterFrame */
	__u32 frame_code;
	__u32 frame_code_tag_mask;
	__u32 frame_previous;
	__u32 frame_instr;
	__u32 frame_instr_kind;  /* 0 int f_lasti, 1 prev_instr, 2 instr_ptr */
	__u32 frame_owner;
	__u32 frame_is_entry;
	__u32 owner_cstack;
	__u32 code_adaptive;
	__u32 code_name;
	__u32 code_qualname;
	__u32 code_filename;
	__u32 code_firstlineno;
	__u32 code_linetable;
	__u32 unicode_state;
	__u32 unicode_length;
	__u32 unicode_ascii_data;
	__u32 unicode_compact_data;
	__u32 bytes_size;
	__u32 bytes_data;
};

/* An interpreter file: kernel st_dev encoding (major << 20 | minor), inode. */
struct py_file_key {
	__u64 dev;
	__u64 ino;
};

/* py_file_val.flags */
#define GFX_PYFILE_LIB 1          /* a shared libpython: found through the mapping of an ip */
#define GFX_PY_LIB_TRIES 64       /* records of a process looked at before it counts as not Python */
#define GFX_PY_SCAN_BYTES 512     /* user stack searched for an address in libpython's code */
#define GFX_PY_VM_EXEC 4          /* vm_flags VM_EXEC: code, not libpython's data */

struct py_file_val {
	__u64 runtime_off;  /* executable: _PyRuntime - lowest PF_X p_vaddr; library:
			     * _PyRuntime - (p_vaddr - p_offset) of its PF_X PT_LOAD */
	__u32 layout;       /* index in py_layouts */
	__u32 flags;        /* GFX_PYFILE_LIB */
};

/* A process of a shared build, once its libpython mapping was found. */
struct py_proc {
	__u64 start;        /* the process's start time: a reused pid is another process */
	__u64 runtime;      /* 0: not found (yet) */
	__u32 layout;
	__u32 tries;        /* lookups that found no libpython */
};

struct py_frame {
	__u64 code;   /* code object address (py_codes key) */
	__u32 instr;  /* instruction value, per version (docs/ARCHITECTURE.md) */
	__u32 flags;  /* GFX_PYF_ENTRY | tag << GFX_PYF_TAG_SHIFT (py_code_key.tag) */
};

/*
 * One record in a program's ring buffer: tgid, tid and flags sit where
 * struct ustack_rec has them, and flags holds GFX_UREC_PYTHON, so a reader
 * tells the two apart by the third word. `ts` is the time the program also
 * writes in the record this one belongs to (ustack_rec.entry_ns), so a
 * reader never joins it to another. `nframes` frames follow, innermost first.
 */
struct py_rec {
	__u32 tgid;
	__u32 tid;
	__u32 flags;    /* GFX_UREC_PYTHON | GFX_PY_TRUNCATED */
	__u32 nframes;
	__u32 version;  /* major << 8 | minor of the layout used */
	__u32 pad;
	__u64 ts;       /* set by the caller: the joined record's time stamp */
	struct py_frame frames[GFX_PY_MAX_FRAMES];
};

#define GFX_PY_HDR (sizeof(struct py_rec) - GFX_PY_MAX_FRAMES * sizeof(struct py_frame))

/* A code object's address may be reused by another once the first is freed:
 * the tag (24 bits mixed from its name and line table pointers) tells the
 * two apart, so a stale copy is never used for the new one. */
struct py_code_key {
	__u32 tgid;
	__u32 tag;
	__u64 code;
};

/* What the client needs to name a code object's frames. Strings: the raw
 * PyUnicode state word, the length in characters, the first bytes of data. */
struct py_code {
	__u32 version;
	__s32 firstlineno;
	__u32 name_state;
	__u32 name_len;
	__u32 file_state;
	__u32 file_len;
	__u32 table_len;  /* the line table's full size (bytes) */
	__u32 pad;
	__u8 name[GFX_PY_NAME];
	__u8 file[GFX_PY_PATH];
	__u8 table[GFX_PY_TABLE];
};

struct py_scratch {
	struct py_rec rec;
	struct py_code code;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GFX_PY_LAYOUTS);
	__type(key, __u32);
	__type(value, struct py_layout);
} py_layouts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GFX_PY_FILES);
	__type(key, struct py_file_key);
	__type(value, struct py_file_val);
} py_files SEC(".maps");

/* tgid -> where a shared build's runtime is (GFX_PYFILE_LIB) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

/* tid -> its thread state address; checked by thread_id at every use */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} py_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, GFX_PY_CODES);
	__type(key, struct py_code_key);
	__type(value, struct py_code);
} py_codes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GFX_PYC_N);
	__type(key, __u32);
	__type(value, __u64);
} py_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_scratch);
} py_scratch SEC(".maps");

/* The kernel structures read, through CO-RE. */
struct super_block___gfxpy {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode___gfxpy {
	unsigned long i_ino;
	struct super_block___gfxpy *i_sb;
} __attribute__((preserve_access_index));

struct file___gfxpy {
	struct inode___gfxpy *f_inode;
} __attribute__((preserve_access_index));

struct mm_struct___gfxpy {
	unsigned long start_code;
	struct file___gfxpy *exe_file;
} __attribute__((preserve_access_index));

struct thread_struct___gfxpy {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct___gfxpy {
	struct mm_struct___gfxpy *mm;
	struct thread_struct___gfxpy thread;
	struct task_struct___gfxpy *group_leader;
	__u64 start_time;
} __attribute__((preserve_access_index));

struct vm_area_struct___gfxpy {
	unsigned long vm_start;
	unsigned long vm_flags;
	unsigned long vm_pgoff;
	struct file___gfxpy *vm_file;
} __attribute__((preserve_access_index));

struct pt_regs___gfxpy {
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

static __always_inline void gfx_py_count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&py_counts, &idx);

	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline __u64 gfx_py_u64(__u64 addr, __u32 *fault)
{
	__u64 v = 0;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		*fault = 1;
	return v;
}

/* The per-CPU record, header cleared (NULL: none, never in practice). */
static __always_inline struct py_rec *gfx_py_record(void)
{
	__u32 zero = 0;
	__u64 id = bpf_get_current_pid_tgid();
	struct py_scratch *s = bpf_map_lookup_elem(&py_scratch, &zero);

	if (!s)
		return 0;
	s->rec.tgid = id >> 32;
	s->rec.tid = (__u32)id;
	s->rec.flags = GFX_UREC_PYTHON;
	s->rec.nframes = 0;
	s->rec.version = 0;
	s->rec.pad = 0;
	s->rec.ts = 0;
	return &s->rec;
}

/* bpf_find_vma's callback: the runtime address if vma maps a registered
 * libpython's code (vm_start - vm_pgoff pages is where the file's offset 0
 * sits; its data mappings may be placed otherwise, so only code counts). */
static long gfx_py_vma(struct task_struct___gfxpy *task, struct vm_area_struct___gfxpy *vma,
		       struct py_proc *found)
{
	struct py_file_key fk = {};
	struct py_file_val *fv;

	if (!(BPF_CORE_READ(vma, vm_flags) & GFX_PY_VM_EXEC))
		return 0;
	fk.dev = BPF_CORE_READ(vma, vm_file, f_inode, i_sb, s_dev);
	fk.ino = BPF_CORE_READ(vma, vm_file, f_inode, i_ino);
	fv = bpf_map_lookup_elem(&py_files, &fk);
	if (!fv || !(fv->flags & GFX_PYFILE_LIB))
		return 0;
	found->runtime = BPF_CORE_READ(vma, vm_start) - (BPF_CORE_READ(vma, vm_pgoff) << 12) +
			 fv->runtime_off;
	found->layout = fv->layout;
	return 0;
}

/* Look for libpython's code at the user ip, then among the words at the top
 * of the user stack (read into the per-CPU code scratch, unused until the
 * runtime is known). Only user-space addresses are looked up. */
static __always_inline void gfx_py_find_lib(struct task_struct___gfxpy *task, struct py_proc *found)
{
	struct pt_regs___gfxpy *regs = (struct pt_regs___gfxpy *)bpf_task_pt_regs((void *)task);
	__u32 zero = 0;
	struct py_scratch *s;
	__u64 *words, w;
	int i;

	bpf_find_vma((void *)task, BPF_CORE_READ(regs, ip), gfx_py_vma, found, 0);
	if (found->runtime)
		return;
	s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s)
		return;
	words = (__u64 *)s->code.table;
	if (bpf_probe_read_user(words, GFX_PY_SCAN_BYTES, (void *)BPF_CORE_READ(regs, sp)))
		return;
	for (i = 0; i < GFX_PY_SCAN_BYTES / 8; i++) {
		w = words[i];
		if (w >= 0x10000 && w < 0x800000000000ULL)
			bpf_find_vma((void *)task, w, gfx_py_vma, found, 0);
		if (found->runtime)
			return;
	}
}

/* A shared build's runtime: remembered for this process, else looked for
 * (0: not found). */
static __always_inline __u64 gfx_py_lib_runtime(struct task_struct___gfxpy *task, __u32 *layout)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 start = BPF_CORE_READ(task, group_leader, start_time);
	struct py_proc found = {}, *p = bpf_map_lookup_elem(&py_procs, &tgid);

	if (p && p->start == start) {
		if (p->runtime) {
			*layout = p->layout;
			return p->runtime;
		}
		if (p->tries >= GFX_PY_LIB_TRIES)
			return 0;
		found.tries = p->tries;
	}
	found.start = start;
	gfx_py_find_lib(task, &found);
	if (!found.runtime)
		found.tries++;
	bpf_map_update_elem(&py_procs, &tgid, &found, BPF_ANY);
	*layout = found.layout;
	return found.runtime;
}

/* The current task's runtime address and layout, if its executable is a
 * registered interpreter file or it maps a registered libpython (0: not
 * Python). */
static __always_inline __u64 gfx_py_runtime(struct py_layout **layout)
{
	struct task_struct___gfxpy *task = (void *)bpf_get_current_task_btf();
	struct py_file_key fk = {};
	struct py_file_val *fv;
	struct mm_struct___gfxpy *mm;
	__u64 runtime;
	__u32 idx = 0;

	mm = BPF_CORE_READ(task, mm);
	if (!mm)
		return 0;
	fk.dev = BPF_CORE_READ(mm, exe_file, f_inode, i_sb, s_dev);
	fk.ino = BPF_CORE_READ(mm, exe_file, f_inode, i_ino);
	fv = bpf_map_lookup_elem(&py_files, &fk);
	if (fv && !(fv->flags & GFX_PYFILE_LIB)) {
		idx = fv->layout;
		runtime = BPF_CORE_READ(mm, start_code) + fv->runtime_off;
	} else {
		runtime = gfx_py_lib_runtime(task, &idx);
	}
	if (!runtime)
		return 0;
	*layout = bpf_map_lookup_elem(&py_layouts, &idx);
	if (!*layout || !(*layout)->version)
		return 0;
	return runtime;
}

/* This thread's thread state: the cached one if its thread_id still is this
 * thread's, else found by a bounded walk of the main interpreter's list.
 * main: the process's main thread's instead (its pthread_self() is the
 * thread group leader's fs base).
 * Global functions (not static, noinline; this one, gfx_py_frame,
 * gfx_py_copy_code, gfx_py_walk) are verified once each, on their own, with
 * their pointer arguments possibly NULL: inlined, the walk cost the verifier
 * 260,000 instructions and 0.3-0.5 s per load, now 45,000. */
__attribute__((noinline)) __u64 gfx_py_tstate(__u64 runtime, struct py_layout *l, __u32 *fault,
					      __u32 main)
{
	struct task_struct___gfxpy *task = (void *)bpf_get_current_task_btf();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = main ? (__u32)(id >> 32) : (__u32)id;  /* the main thread's tid is the tgid */
	__u64 self = main ? BPF_CORE_READ(task, group_leader, thread.fsbase)
			  : BPF_CORE_READ(task, thread.fsbase);
	__u64 *cached = bpf_map_lookup_elem(&py_threads, &tid);
	__u64 ts, interp;
	int i;

	if (!l || !fault)
		return 0;
	if (cached && *cached && gfx_py_u64(*cached + l->tstate_thread_id, fault) == self)
		return *cached;
	*fault = 0;
	interp = gfx_py_u64(runtime + l->runtime_interp_head, fault);
	if (!interp)
		return 0;
	ts = gfx_py_u64(interp + l->interp_tstate_head, fault);
	for (i = 0; i < GFX_PY_THREADS && ts; i++) {
		if (gfx_py_u64(ts + l->tstate_thread_id, fault) == self) {
			bpf_map_update_elem(&py_threads, &tid, &ts, BPF_ANY);
			return ts;
		}
		ts = gfx_py_u64(ts + l->tstate_next, fault);
	}
	return 0;
}

/* The innermost frame of a thread state (0: none running). */
static __always_inline __u64 gfx_py_top_frame(__u64 ts, struct py_layout *l, __u32 *fault)
{
	__u64 f = gfx_py_u64(ts + l->tstate_frame, fault);

	if (f && l->cframe_current_frame != GFX_PY_NONE)
		f = gfx_py_u64(f + l->cframe_current_frame, fault);
	return f;
}

/* The instruction value of a frame (docs/ARCHITECTURE.md, "Python frames"). */
static __always_inline __u32 gfx_py_instr(__u64 f, __u64 code, struct py_layout *l, __u32 *fault)
{
	__u64 p, base;
	__s32 lasti = 0;

	if (l->frame_instr_kind == 0) {
		if (bpf_probe_read_user(&lasti, sizeof(lasti), (void *)(f + l->frame_instr)))
			*fault = 1;
		return (__u32)lasti;  /* -1: not started, as the client expects */
	}
	p = gfx_py_u64(f + l->frame_instr, fault);
	base = code + l->code_adaptive;
	if (p < base)
		return 0xFFFFFFFFu;  /* before the first instruction: not started */
	p = (p - base) / 2;
	return p > 0xFFFFFFFFull ? 0xFFFFFFFFu : (__u32)p;
}

/* The code object's tag (py_code_key). */
static __always_inline __u32 gfx_py_tag(__u64 code, struct py_layout *l, __u32 *fault)
{
	__u32 off = l->code_qualname != GFX_PY_NONE ? l->code_qualname : l->code_name;
	__u64 name = gfx_py_u64(code + off, fault);
	__u64 table = gfx_py_u64(code + l->code_linetable, fault);

	return (__u32)(((name ^ (table << 1)) * 0x9E3779B97F4A7C15ull) >> 40);
}

static __always_inline __u8 gfx_py_byte(__u64 addr, __u32 *fault)
{
	__u8 v = 0;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		*fault = 1;
	return v;
}

/*
 * Add frame f to r (a shim frame only marks the one before it as an entry);
 * the frame before f (0: none, or f has no code object). Global: checked
 * once, not once for each of the walk's iterations.
 */
__attribute__((noinline)) __u64 gfx_py_frame(struct py_rec *r, struct py_layout *l, __u64 f)
{
	__u32 fl, idx;
	__u64 code;

	if (!r || !l)
		return 0;
	code = gfx_py_u64(f + l->frame_code, &r->pad) & ~(__u64)l->frame_code_tag_mask;
	fl = l->frame_kind == 0 ? GFX_PYF_ENTRY : 0;
	idx = r->nframes;
	if (l->frame_owner != GFX_PY_NONE &&
	    gfx_py_byte(f + l->frame_owner, &r->pad) == l->owner_cstack) {
		/* 3.12+: a shim the C stack owns; the frame before it entered. */
		if (idx > 0)
			r->frames[(idx - 1) & (GFX_PY_MAX_FRAMES - 1)].flags |= GFX_PYF_ENTRY;
		return gfx_py_u64(f + l->frame_previous, &r->pad);
	}
	if (l->frame_is_entry != GFX_PY_NONE && gfx_py_byte(f + l->frame_is_entry, &r->pad))
		fl = GFX_PYF_ENTRY;
	if (!code)
		return 0;
	idx &= GFX_PY_MAX_FRAMES - 1;
	r->frames[idx].code = code;
	r->frames[idx].instr = gfx_py_instr(f, code, l, &r->pad);
	r->frames[idx].flags = fl | gfx_py_tag(code, l, &r->pad) << GFX_PYF_TAG_SHIFT;
	r->nframes = idx + 1;
	return gfx_py_u64(f + l->frame_previous, &r->pad);
}

#ifdef GFX_PY_BORROW_MAIN
/*
 * A program that defines GFX_PY_BORROW_MAIN (cudakernels) walks, for a
 * thread that runs no Python frame, the main thread's frames instead, and
 * marks the record GFX_PY_MAIN: autograd's device threads (pt_autograd_N)
 * launch every backward kernel with no Python of their own while the main
 * thread waits in loss.backward(), so that line names the backward pass.
 * What the main thread runs at that moment, not a cause: the client shows
 * the frames under a marker saying whose they are. The innermost frame (0:
 * none) of the main thread's thread state.
 */
static __always_inline __u64 gfx_py_main_frame(__u64 runtime, struct py_layout *l,
					       struct py_rec *r)
{
	__u32 fault = 0;
	__u64 ts = gfx_py_tstate(runtime, l, &fault, 1), f;

	if (!ts)
		return 0;
	f = gfx_py_top_frame(ts, l, &r->pad);
	if (f)
		r->flags |= GFX_PY_MAIN;
	return f;
}
#endif

/*
 * Fill r with the current task's Python frames, innermost first; the
 * number of frames (0: not a Python task, or no frame running). The frame
 * count and the fault flag live in r (map memory), not in registers: the
 * verifier then sees one state per iteration instead of one per count.
 */
static __always_inline __u32 gfx_py_frames(struct py_rec *r, struct py_layout **lp)
{
	__u32 limit = python_frames < GFX_PY_MAX_FRAMES ? python_frames : GFX_PY_MAX_FRAMES;
	struct py_layout *l = 0;
	__u64 runtime, ts, f;
	__u32 tfault = 0;
	int i;

	runtime = gfx_py_runtime(&l);
	if (!runtime || !l)
		return 0;
	*lp = l;
	r->version = l->version;
	ts = gfx_py_tstate(runtime, l, &tfault, 0);
	if (!ts)
		gfx_py_count(tfault ? GFX_PYC_FAULT : GFX_PYC_NO_THREAD);
	r->pad = 0;  /* the fault flag during the walk */
	f = ts ? gfx_py_top_frame(ts, l, &r->pad) : 0;
#ifdef GFX_PY_BORROW_MAIN
	if (!f && !r->pad && r->tid != r->tgid)
		f = gfx_py_main_frame(runtime, l, r);
#endif
	for (i = 0; i < GFX_PY_MAX_FRAMES && f; i++) {
		if (r->nframes >= limit || r->pad)
			break;
		f = gfx_py_frame(r, l, f);
	}
	if (r->pad)
		gfx_py_count(GFX_PYC_FAULT);
	else if (f && r->nframes >= limit) {
		r->flags |= GFX_PY_TRUNCATED;
		gfx_py_count(GFX_PYC_TRUNCATED);
	}
	r->pad = 0;
	if (r->nframes)
		gfx_py_count(GFX_PYC_WALKED);
	return r->nframes;
}

/* Copy a PyUnicode's state, length and first bytes of data. */
static __always_inline void gfx_py_str(__u64 s, struct py_layout *l, __u32 *state, __u32 *len,
				       __u8 *dst, __u32 cap)
{
	__u64 length = 0, n, data;
	__u32 st = 0, kind;

	*state = 0;
	*len = 0;
	if (!s || bpf_probe_read_user(&st, sizeof(st), (void *)(s + l->unicode_state)) ||
	    bpf_probe_read_user(&length, sizeof(length), (void *)(s + l->unicode_length)))
		return;
	*state = st;
	*len = length > 0xFFFFFFFFull ? 0xFFFFFFFFu : (__u32)length;
	/* kind: bits 2-4 (1, 2 or 4 bytes a character); ascii: bit 6. */
	kind = (st >> 2) & 7;
	data = s + ((st >> 6) & 1 ? l->unicode_ascii_data : l->unicode_compact_data);
	n = length * (kind ? kind : 1);
	if (n > cap)
		n = cap;
	asm volatile("" : "+r"(n));
	if (n > GFX_PY_PATH || n == 0)
		return;
	if (bpf_probe_read_user(dst, n, (void *)data))
		*len = 0;
}

/* Copy one code object into py_codes unless it is there (the client names
 * its frames from it). Global, as gfx_py_frame: checked once. The key is
 * built on the stack and the value taken from the scratch map here, not
 * passed in: a global function's pointer arguments are plain memory to the
 * verifier, which Linux 6.1 refuses as a map key or value. */
__attribute__((noinline)) int gfx_py_copy_code(__u32 tgid, __u32 tag, __u64 code,
						struct py_layout *l)
{
	struct py_code_key k = {.tgid = tgid, .tag = tag, .code = code};
	__u64 name, file, table, size = 0;
	__u32 fault = 0, zero = 0;
	struct py_scratch *s;
	struct py_code *c;

	if (!l || bpf_map_lookup_elem(&py_codes, &k))
		return 0;
	s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s)
		return 0;
	c = &s->code;

	c->version = l->version;
	c->firstlineno = 0;
	c->table_len = 0;
	c->pad = 0;
	bpf_probe_read_user(&c->firstlineno, sizeof(c->firstlineno),
			    (void *)(code + l->code_firstlineno));
	name = gfx_py_u64(code + (l->code_qualname != GFX_PY_NONE ? l->code_qualname : l->code_name),
			  &fault);
	file = gfx_py_u64(code + l->code_filename, &fault);
	table = gfx_py_u64(code + l->code_linetable, &fault);
	gfx_py_str(name, l, &c->name_state, &c->name_len, c->name, GFX_PY_NAME);
	gfx_py_str(file, l, &c->file_state, &c->file_len, c->file, GFX_PY_PATH);
	if (table && !bpf_probe_read_user(&size, sizeof(size), (void *)(table + l->bytes_size))) {
		c->table_len = size > 0xFFFFFFFFull ? 0xFFFFFFFFu : (__u32)size;
		if (size > GFX_PY_TABLE)
			size = GFX_PY_TABLE;
		asm volatile("" : "+r"(size));
		if (size > 0 && size <= GFX_PY_TABLE &&
		    bpf_probe_read_user(c->table, size, (void *)(table + l->bytes_data)))
			c->table_len = 0;
	}
	if (bpf_map_update_elem(&py_codes, &k, c, BPF_NOEXIST) && !bpf_map_lookup_elem(&py_codes, &k))
		gfx_py_count(GFX_PYC_CODE_LOST);
	return 0;
}

/* Copy the code objects of r's frames that py_codes does not hold yet. */
static __always_inline void gfx_py_codes(struct py_rec *r, struct py_layout *l)
{
	__u32 i;

	for (i = 0; i < GFX_PY_MAX_FRAMES; i++) {
		if (i >= r->nframes)
			break;
		gfx_py_copy_code(r->tgid,
				 r->frames[i & (GFX_PY_MAX_FRAMES - 1)].flags >> GFX_PYF_TAG_SHIFT,
				 r->frames[i & (GFX_PY_MAX_FRAMES - 1)].code, l);
	}
}

/*
 * The one call a program makes after gfx_task_ok(): fill r (from
 * gfx_py_record()) with the current task's Python frames and store the code
 * objects not met before; the number of frames.
 */
__attribute__((noinline)) __u32 gfx_py_walk(struct py_rec *r)
{
	struct py_layout *l = 0;
	__u32 n;

	if (!r)
		return 0;
	n = gfx_py_frames(r, &l);

	if (n && l)
		gfx_py_codes(r, l);
	return n;
}

/* Send r (its frames only) to ring; false when the ring was full. */
static __always_inline int gfx_py_send(void *ring, struct py_rec *r)
{
	__u64 size = GFX_PY_HDR + (__u64)r->nframes * sizeof(struct py_frame);

	asm volatile("" : "+r"(size));
	if (size > sizeof(struct py_rec))
		return 0;
	return bpf_ringbuf_output(ring, r, size, BPF_RB_NO_WAKEUP) == 0;
}

#endif /* GFX_PYTHON_H */

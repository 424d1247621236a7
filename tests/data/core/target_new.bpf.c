/* A stand-in "kernel" for the CO-RE unit tests: only its BTF is used.
 * The newer layout: task_struct has __state, an anonymous struct and
 * bitfields; rq_state lacks RQ_OLD; only_new and amb/amb___v2 exist. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct mm_struct {
	unsigned long total_vm;
	int map_count;
};

struct task_struct {
	int pad0;
	long __state;
	int pid;
	struct {
		int anon_a;
		int anon_b;
	};
	char comm[16];
	unsigned int flags_lo : 3, prio : 5;
	int nice : 7;
	struct mm_struct *mm;
	unsigned int usage;
	int weight;
	int tail[];
};

enum rq_state { RQ_IDLE = 10, RQ_BUSY = 20, RQ_NEW = 30 };

struct only_new {
	int x;
};

union u_thing {
	int a;
	long b;
};

/* Two flavours of one name with different layouts: ambiguous for a reader. */
struct amb {
	int pad;
	int x;
};
struct amb___v2 {
	int x;
};

typedef unsigned int u32_t;

struct task_struct t_task;
struct mm_struct t_mm;
struct only_new t_only_new;
enum rq_state t_rq;
union u_thing t_u;
struct amb t_amb;
struct amb___v2 t_amb2;
u32_t t_u32;

char LICENSE[] SEC("license") = "GPL";

/* A stand-in for libnvidia-ml.so.1: the NVML C functions clusterwatch reaches through pynvml.
 *
 * The real pynvml (nvidia-ml-py) loads this library as it loads the driver's, so the bindings'
 * own ctypes structs, size queries and version fallbacks are what the tests exercise. Its state
 * is a text file named by NVML_STUB_STATE, re-read whenever its inode, mtime or size changes, so a
 * test rewrites it between polls. One directive a line, '#' starts a comment:
 *
 *   gpu UUID total=B used=B util=PCT power=MW [lost=1] [mig=1] [serial=S] name=NAME WITH SPACES
 *      (serial=: the board's serial, nvmlDeviceGetSerial; NOT_SUPPORTED without it, as on consumer GPUs)
 *   mig PARENT_UUID SLOT UUID total=B used=B gi=N ci=N name=NAME      (a MIG instance in SLOT)
 *   proc UUID PID MEM|na [compute|graphics|mps]                       (na: NVML_VALUE_NOT_AVAILABLE)
 *   sample UUID PID SM ts=US | age_us=US                              (process utilisation sample)
 *   fail FUNCTION CODE [UUID]                                         (FUNCTION returns CODE)
 *   delay FUNCTION|* MS [UUID]                                        (FUNCTION sleeps MS first)
 *   init_error CODE
 *   driver VERSION
 *   event UUID TYPE DATA                                              (an NVML event, delivered once)
 *   ecc UUID corrected_volatile=N uncorrected_volatile=N corrected_aggregate=N uncorrected_aggregate=N
 *   remapped UUID corrected=N uncorrected=N pending=0|1 failure=0|1
 *
 * A gpu line may also carry energy=MJ (the total-energy counter, millijoules since the driver loaded; a GPU
 * without it answers NOT_SUPPORTED, as one before Volta), temp=C (temperature), throttle=MASK (clock event reasons),
 * events=MASK (supported event types; default single/double-bit ECC, P-state, Xid, clock) and
 * pci=DOMAIN:BUS:DEV (hex; default 0000:(16+index):00).
 *
 *   health UUID [viol_power_ns=N viol_thermal_ns=N viol_sync_ns=N viol_board_ns=N viol_low_util_ns=N
 *          viol_reliability_ns=N] [replay=N] [retired_sbe=N retired_dbe=N retired_pending=0|1]
 *          [nvlinks=N nvlink_replay=N nvlink_recovery=N nvlink_crc_flit=N nvlink_crc_data=N]
 *          [nvlink_state=BITS]
 *     (violation time per perf policy, PCIe replays, retired pages, NVLink error counters: each
 *      counter is per link, on links 0..nvlinks-1; a link past them answers NOT_SUPPORTED, and past
 *      NVML_NVLINK_MAX_LINKS INVALID_ARGUMENT. nvlink_state gives each link's state, link 0 first, one
 *      digit a link: 1 active, 0 inactive; a link it does not name is active)
 *
 *   gpm UUID [sm=PCT occupancy=PCT tensor=PCT dram=PCT graphics=PCT pcie_tx=MIBS pcie_rx=MIBS
 *            nvlink_tx=MIBS nvlink_rx=MIBS]
 *     (GPU Performance Monitoring, Hopper and later: a GPU without a gpm line answers NOT_SUPPORTED to
 *      every GPM call, as an older GPU does; a figure not given answers NOT_SUPPORTED for its metric
 *      alone. UUID may name a MIG instance, read through nvmlGpmMigSampleGet on its parent, whose own
 *      gpm line says the GPU has GPM. A sample holds the figures in force when it was taken; a metric's
 *      value is the mean of its two samples' figures, so a figure changed between them reads between.)
 *
 * Layouts follow nvml.h: nvmlProcessInfo_v1_t {pid, usedGpuMemory} for the unversioned list
 * functions, nvmlProcessInfo_v2_t {pid, usedGpuMemory, gpuInstanceId, computeInstanceId} for _v2
 * and _v3; nvmlProcessUtilizationSample_t {pid, timeStamp, smUtil, memUtil, encUtil, decUtil}.
 * Built with -DNVML_STUB_NO_V3, the _v3 process functions are absent: a driver older than R510.
 * Every call is counted into NVML_STUB_CALLS (a file, appended) when that variable is set.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_UNKNOWN = 999,
};

#define MAX_DEV 64
#define MAX_MIG 8
#define MAX_PROC 1024
#define MAX_SAMPLE 4096
#define MAX_RULE 128

typedef struct nvmlDevice_st {
    int used;                 /* slot holds a device in the current state */
    int mig_parent;           /* -1: a whole GPU; else the parent's slot */
    int mig_slot;
    char uuid[96];
    char name[96];
    char serial[32];          /* "": nvmlDeviceGetSerial is NOT_SUPPORTED */
    unsigned long long total, memused;
    unsigned int util, power_mw, gi, ci, temp;
    unsigned long long throttle, event_types;
    unsigned long long energy_mj;   /* the energy counter; has_energy: an energy= was given */
    int has_energy;
    unsigned long long ecc[2][2];   /* [uncorrected?][aggregate?] */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    int lost, mig_mode;
    unsigned int pci_domain, pci_bus, pci_dev;
    unsigned long long viol_ns[6];   /* by nvmlPerfPolicyType_t 0..5 */
    unsigned int replay, retired[2], retired_pending, nvlinks;
    unsigned long long nvlink_err[4];   /* replay, recovery, crc flit, crc data: per link */
    unsigned long long nvlink_off;      /* bit i: link i is inactive (nvlink_state) */
    int gpm;                            /* has GPM (a gpm line) */
    unsigned int gpm_given;             /* bit i: gpm_fig[i] was given */
    double gpm_fig[9];                  /* by GPM_KEYS */
} *nvmlDevice_t;

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef struct {
    unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

struct proc { int dev; unsigned int pid; unsigned long long mem; int kind; };  /* 0 compute 1 graphics 2 mps */
struct sample { int dev; unsigned int pid, sm; unsigned long long ts; long long age_us; };
struct rule { char fn[80]; int dev; int value; };   /* dev -1: every device */
struct event { int dev; unsigned long long type, data; };
typedef struct { unsigned long long mask[MAX_DEV + MAX_DEV * MAX_MIG]; int used; } *nvmlEventSet_t;
typedef struct {
    nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
#define MAX_EVENT 256

static struct nvmlDevice_st devs[MAX_DEV + MAX_DEV * MAX_MIG];
static int ndev;                                      /* whole GPUs, slots 0..ndev-1 */
static struct proc procs[MAX_PROC]; static int nproc;
static struct sample samples[MAX_SAMPLE]; static int nsample;
static struct rule fails[MAX_RULE], delays[MAX_RULE]; static int nfail, ndelay;
static struct event events[MAX_EVENT]; static int nevent;
static int events_delivered;   /* events of the state file given out so far (each once) */
static int init_error;
static char driver[64] = "580.65.06";
static int initialized;
static struct timespec state_mtime; static off_t state_size = -1; static ino_t state_ino;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* GPM figures a gpm line may give, and the NVML_GPM_METRIC_* id each answers */
#define GPM_FIGURES 9
static const char *GPM_KEYS[GPM_FIGURES] = {"sm", "occupancy", "tensor", "dram", "graphics", "pcie_tx", "pcie_rx",
                                            "nvlink_tx", "nvlink_rx"};
static const unsigned int GPM_IDS[GPM_FIGURES] = {2, 3, 5, 10, 1, 20, 21, 61, 60};

static nvmlDevice_t mig_dev(int parent, int slot) { return &devs[MAX_DEV + parent * MAX_MIG + slot]; }

static int find_uuid(const char *uuid) {
    for (int i = 0; i < MAX_DEV + MAX_DEV * MAX_MIG; i++)
        if (devs[i].used && strcmp(devs[i].uuid, uuid) == 0) return i;
    return -2;   /* a name no device carries: rules and processes for it never apply */
}

static const char *kv(const char *line, const char *key) {
    /* the value after " key=" (or at the start), up to the next space */
    size_t n = strlen(key);
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += n)
        if ((p == line || p[-1] == ' ') && p[n] == '=') return p + n + 1;
    return NULL;
}

static unsigned long long kv_num(const char *line, const char *key, unsigned long long dflt) {
    const char *v = kv(line, key);
    return v ? strtoull(v, NULL, 10) : dflt;
}

static void kv_name(const char *line, char *out, size_t size) {
    const char *v = kv(line, "name");   /* name= is last: the rest of the line */
    snprintf(out, size, "%s", v ? v : "NVIDIA Stand-in GPU");
    out[strcspn(out, "\n")] = 0;
}

static void parse_rule(char *rest, struct rule *r) {
    char fn[80] = "", uuid[96] = "";
    int value = 0;
    sscanf(rest, "%79s %d %95s", fn, &value, uuid);
    snprintf(r->fn, sizeof r->fn, "%s", fn);
    r->value = value;
    r->dev = uuid[0] ? find_uuid(uuid) : -1;
}

static void load_state(void) {
    const char *path = getenv("NVML_STUB_STATE");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (st.st_ino == state_ino && st.st_size == state_size && st.st_mtim.tv_sec == state_mtime.tv_sec
        && st.st_mtim.tv_nsec == state_mtime.tv_nsec) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    state_mtime = st.st_mtim; state_size = st.st_size; state_ino = st.st_ino;
    memset(devs, 0, sizeof devs);
    ndev = nproc = nsample = nfail = ndelay = nevent = 0; init_error = 0;
    char line[1024];
    /* two passes: devices first, so rules and processes may name any device */
    for (int pass = 0; pass < 2; pass++) {
        rewind(f);
        while (fgets(line, sizeof line, f)) {
            char word[16] = "", uuid[96] = "";
            if (line[0] == '#' || sscanf(line, "%15s", word) != 1) continue;
            char *rest = line + strlen(word);
            while (*rest == ' ') rest++;
            if (pass == 0 && strcmp(word, "gpu") == 0 && ndev < MAX_DEV) {
                nvmlDevice_t d = &devs[ndev++];
                sscanf(rest, "%95s", d->uuid);
                d->used = 1; d->mig_parent = -1;
                d->total = kv_num(rest, "total", 80ULL << 30);
                d->memused = kv_num(rest, "used", 0);
                d->util = (unsigned)kv_num(rest, "util", 0);
                d->power_mw = (unsigned)kv_num(rest, "power", 100000);
                d->has_energy = kv(rest, "energy") != NULL;
                d->energy_mj = kv_num(rest, "energy", 0);
                d->lost = (int)kv_num(rest, "lost", 0);
                d->mig_mode = (int)kv_num(rest, "mig", 0);
                d->temp = (unsigned)kv_num(rest, "temp", 40);
                d->throttle = kv(rest, "throttle") ? strtoull(kv(rest, "throttle"), NULL, 0) : 0;
                d->event_types = kv(rest, "events") ? strtoull(kv(rest, "events"), NULL, 0) : 0x1F;
                d->pci_bus = 16u + (unsigned)(ndev - 1);
                if (kv(rest, "pci")) sscanf(kv(rest, "pci"), "%x:%x:%x", &d->pci_domain, &d->pci_bus, &d->pci_dev);
                if (kv(rest, "serial")) sscanf(kv(rest, "serial"), "%31s", d->serial);
                kv_name(rest, d->name, sizeof d->name);
            } else if (pass == 0 && strcmp(word, "mig") == 0) {
                char parent[96] = ""; int slot = -1;
                sscanf(rest, "%95s %d %95s", parent, &slot, uuid);
                int p = -1;
                for (int i = 0; i < ndev; i++) if (strcmp(devs[i].uuid, parent) == 0) p = i;
                if (p < 0 || slot < 0 || slot >= MAX_MIG) continue;
                nvmlDevice_t d = mig_dev(p, slot);
                snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
                d->used = 1; d->mig_parent = p; d->mig_slot = slot;
                d->total = kv_num(rest, "total", 10ULL << 30);
                d->memused = kv_num(rest, "used", 0);
                d->power_mw = devs[p].power_mw;
                d->gi = (unsigned)kv_num(rest, "gi", (unsigned long long)slot + 1);
                d->ci = (unsigned)kv_num(rest, "ci", 0);
                kv_name(rest, d->name, sizeof d->name);
            } else if (pass == 1 && strcmp(word, "proc") == 0 && nproc < MAX_PROC) {
                char mem[32] = "", kind[16] = "compute"; unsigned int pid = 0;
                sscanf(rest, "%95s %u %31s %15s", uuid, &pid, mem, kind);
                struct proc *p = &procs[nproc++];
                p->dev = find_uuid(uuid); p->pid = pid;
                p->mem = strcmp(mem, "na") == 0 ? ~0ULL : strtoull(mem, NULL, 10);
                p->kind = strcmp(kind, "graphics") == 0 ? 1 : strcmp(kind, "mps") == 0 ? 2 : 0;
            } else if (pass == 1 && strcmp(word, "sample") == 0 && nsample < MAX_SAMPLE) {
                unsigned int pid = 0, sm = 0;
                sscanf(rest, "%95s %u %u", uuid, &pid, &sm);
                struct sample *s = &samples[nsample++];
                s->dev = find_uuid(uuid); s->pid = pid; s->sm = sm;
                s->ts = kv_num(rest, "ts", 0);
                s->age_us = kv(rest, "age_us") ? (long long)kv_num(rest, "age_us", 0) : -1;
            } else if (pass == 1 && strcmp(word, "fail") == 0 && nfail < MAX_RULE) {
                parse_rule(rest, &fails[nfail++]);
            } else if (pass == 1 && strcmp(word, "delay") == 0 && ndelay < MAX_RULE) {
                parse_rule(rest, &delays[ndelay++]);
            } else if (pass == 1 && strcmp(word, "event") == 0 && nevent < MAX_EVENT) {
                char type[32] = "0", data[32] = "0";
                sscanf(rest, "%95s %31s %31s", uuid, type, data);
                struct event *e = &events[nevent++];
                e->dev = find_uuid(uuid); e->type = strtoull(type, NULL, 0); e->data = strtoull(data, NULL, 0);
            } else if (pass == 1 && strcmp(word, "ecc") == 0) {
                sscanf(rest, "%95s", uuid);
                int slot = find_uuid(uuid);
                if (slot < 0) continue;
                devs[slot].ecc[0][0] = kv_num(rest, "corrected_volatile", 0);
                devs[slot].ecc[1][0] = kv_num(rest, "uncorrected_volatile", 0);
                devs[slot].ecc[0][1] = kv_num(rest, "corrected_aggregate", 0);
                devs[slot].ecc[1][1] = kv_num(rest, "uncorrected_aggregate", 0);
            } else if (pass == 1 && strcmp(word, "remapped") == 0) {
                sscanf(rest, "%95s", uuid);
                int slot = find_uuid(uuid);
                if (slot < 0) continue;
                devs[slot].remap_corr = (unsigned)kv_num(rest, "corrected", 0);
                devs[slot].remap_unc = (unsigned)kv_num(rest, "uncorrected", 0);
                devs[slot].remap_pending = (unsigned)kv_num(rest, "pending", 0);
                devs[slot].remap_failure = (unsigned)kv_num(rest, "failure", 0);
            } else if (pass == 1 && strcmp(word, "health") == 0) {
                static const char *viol[6] = {"viol_power_ns", "viol_thermal_ns", "viol_sync_ns",
                                              "viol_board_ns", "viol_low_util_ns", "viol_reliability_ns"};
                static const char *link[4] = {"nvlink_replay", "nvlink_recovery", "nvlink_crc_flit",
                                              "nvlink_crc_data"};
                sscanf(rest, "%95s", uuid);
                int slot = find_uuid(uuid);
                if (slot < 0) continue;
                nvmlDevice_t d = &devs[slot];
                for (int i = 0; i < 6; i++) d->viol_ns[i] = kv_num(rest, viol[i], 0);
                for (int i = 0; i < 4; i++) d->nvlink_err[i] = kv_num(rest, link[i], 0);
                d->replay = (unsigned)kv_num(rest, "replay", 0);
                d->retired[0] = (unsigned)kv_num(rest, "retired_sbe", 0);
                d->retired[1] = (unsigned)kv_num(rest, "retired_dbe", 0);
                d->retired_pending = (unsigned)kv_num(rest, "retired_pending", 0);
                d->nvlinks = (unsigned)kv_num(rest, "nvlinks", 0);
                const char *bits = kv(rest, "nvlink_state");
                for (int i = 0; bits && i < 64 && (bits[i] == '0' || bits[i] == '1'); i++)
                    if (bits[i] == '0') d->nvlink_off |= 1ull << i;
            } else if (pass == 1 && strcmp(word, "gpm") == 0) {
                sscanf(rest, "%95s", uuid);
                int slot = find_uuid(uuid);
                if (slot < 0) continue;
                nvmlDevice_t d = &devs[slot];
                d->gpm = 1;
                for (int i = 0; i < GPM_FIGURES; i++)
                    if (kv(rest, GPM_KEYS[i])) { d->gpm_fig[i] = strtod(kv(rest, GPM_KEYS[i]), NULL); d->gpm_given |= 1u << i; }
            } else if (pass == 1 && strcmp(word, "init_error") == 0) {
                init_error = atoi(rest);
            } else if (pass == 1 && strcmp(word, "driver") == 0) {
                sscanf(rest, "%63s", driver);
            }
        }
    }
    fclose(f);
}

static void count_call(const char *fn, const char *uuid) {
    const char *path = getenv("NVML_STUB_CALLS");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %s\n", fn, uuid ? uuid : "-");
    fclose(f);
}

static int dev_slot(nvmlDevice_t d) {
    if (d < devs || d >= devs + MAX_DEV + MAX_DEV * MAX_MIG) return -1;
    return (int)(d - devs);
}

/* Enter a device function: the state re-read, the call counted, the rules applied.
 * Returns NVML_SUCCESS or the code the call must return; the delay is slept outside the lock
 * so that one slow GPU does not hold up calls on the others (NVML is thread-safe). */
static nvmlReturn_t enter(const char *fn, nvmlDevice_t d) {
    int delay_ms = 0; nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    load_state();
    int slot = d ? dev_slot(d) : -1;
    count_call(fn, slot >= 0 ? devs[slot].uuid : NULL);
    if (!initialized) ret = NVML_ERROR_UNINITIALIZED;
    else if (d && (slot < 0 || !devs[slot].used)) ret = NVML_ERROR_GPU_IS_LOST;   /* gone from the state */
    else if (d && (devs[slot].lost || (devs[slot].mig_parent >= 0 && devs[devs[slot].mig_parent].lost)))
        ret = NVML_ERROR_GPU_IS_LOST;
    for (int i = 0; i < nfail && ret == NVML_SUCCESS; i++)
        if (strcmp(fails[i].fn, fn) == 0 && (fails[i].dev == -1 || fails[i].dev == slot)) ret = fails[i].value;
    for (int i = 0; i < ndelay; i++)
        if ((strcmp(delays[i].fn, fn) == 0 || strcmp(delays[i].fn, "*") == 0)
            && (delays[i].dev == -1 || delays[i].dev == slot)) delay_ms = delays[i].value;
    pthread_mutex_unlock(&lock);
    if (delay_ms > 0) {
        struct timespec t = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
    }
    return ret;
}

/* --- library ----------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    load_state();
    count_call("nvmlInitWithFlags", NULL);
    nvmlReturn_t ret = init_error;
    if (ret == NVML_SUCCESS) initialized++;
    pthread_mutex_unlock(&lock);
    return ret;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    count_call("nvmlShutdown", NULL);
    nvmlReturn_t ret = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialized) initialized--;
    pthread_mutex_unlock(&lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 16: return "GPU requires reset";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t ret = enter("nvmlSystemGetDriverVersion", NULL);
    return ret ? ret : copy_text(driver, version, length);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t ret = enter("nvmlSystemGetNVMLVersion", NULL);
    char text[80];
    snprintf(text, sizeof text, "13.%s", driver);
    return ret ? ret : copy_text(text, version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t ret = enter("nvmlDeviceGetCount_v2", NULL);
    if (ret == NVML_SUCCESS) *count = (unsigned)ndev;
    return ret;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t ret = enter("nvmlDeviceGetHandleByIndex_v2", NULL);
    if (ret) return ret;
    if (index >= (unsigned)ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devs[index];
    /* a lost GPU answers for its handle, then fails everything else */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t ret = enter("nvmlDeviceGetHandleByUUID", NULL);
    if (ret) return ret;
    int slot = find_uuid(uuid);
    if (slot < 0) return NVML_ERROR_NOT_FOUND;
    *device = &devs[slot];
    return NVML_SUCCESS;
}

/* --- identity ---------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    nvmlReturn_t ret = enter("nvmlDeviceGetUUID", d);
    return ret ? ret : copy_text(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    nvmlReturn_t ret = enter("nvmlDeviceGetName", d);
    return ret ? ret : copy_text(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *serial, unsigned int length) {
    nvmlReturn_t ret = enter("nvmlDeviceGetSerial", d);
    if (ret) return ret;
    if (d->mig_parent >= 0 || !d->serial[0]) return NVML_ERROR_NOT_SUPPORTED;   /* a board without one */
    return copy_text(d->serial, serial, length);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    nvmlReturn_t ret = enter("nvmlDeviceGetIndex", d);
    if (ret == NVML_SUCCESS) *index = (unsigned)(d->mig_parent >= 0 ? d->mig_parent : dev_slot(d));
    return ret;
}

/* --- readings ---------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    nvmlReturn_t ret = enter("nvmlDeviceGetMemoryInfo", d);
    if (ret) return ret;
    memory->total = d->total; memory->used = d->memused;
    memory->free = d->total > d->memused ? d->total - d->memused : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *memory) {
    nvmlReturn_t ret = enter("nvmlDeviceGetMemoryInfo_v2", d);
    if (ret) return ret;
    memory->total = d->total; memory->used = d->memused; memory->reserved = 0;
    memory->free = d->total > d->memused ? d->total - d->memused : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *util) {
    nvmlReturn_t ret = enter("nvmlDeviceGetUtilizationRates", d);
    if (ret) return ret;
    if (d->mig_parent >= 0 || d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;   /* as documented for MIG */
    util->gpu = d->util; util->memory = d->util / 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *power) {
    nvmlReturn_t ret = enter("nvmlDeviceGetPowerUsage", d);
    if (ret) return ret;
    if (d->mig_parent >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *power = d->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *energy) {
    nvmlReturn_t ret = enter("nvmlDeviceGetTotalEnergyConsumption", d);
    if (ret) return ret;
    if (d->mig_parent >= 0 || !d->has_energy) return NVML_ERROR_NOT_SUPPORTED;   /* the whole GPU's counter */
    *energy = d->energy_mj;
    return NVML_SUCCESS;
}

/* The process lists: size query (infos NULL or *count too small: INSUFFICIENT_SIZE with the
 * count), then the fill. On a MIG-mode parent the list holds every instance's processes with
 * their instance ids; on an instance, its own. */
static nvmlReturn_t list_procs(const char *fn, nvmlDevice_t d, int kind, unsigned int *count,
                               void *infos, int version) {
    nvmlReturn_t ret = enter(fn, d);
    if (ret) return ret;
    int slot = dev_slot(d);
    unsigned int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nproc; i++) {
        struct proc *p = &procs[i];
        if (p->kind != kind || p->dev < 0) continue;
        int on_parent = devs[p->dev].mig_parent == slot && d->mig_mode;
        if (p->dev != slot && !on_parent) continue;
        if (infos && n < *count) {
            if (version == 1) {
                nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + n;
                o->pid = p->pid; o->usedGpuMemory = p->mem;
            } else {
                nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + n;
                nvmlDevice_t owner = &devs[p->dev];
                o->pid = p->pid; o->usedGpuMemory = p->mem;
                o->gpuInstanceId = owner->mig_parent >= 0 ? owner->gi : 0xFFFFFFFFu;
                o->computeInstanceId = owner->mig_parent >= 0 ? owner->ci : 0xFFFFFFFFu;
            }
        }
        n++;
    }
    pthread_mutex_unlock(&lock);
    if (n == 0) { *count = 0; return NVML_SUCCESS; }
    if (!infos || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    *count = n;
    return NVML_SUCCESS;
}

#define PROC_FUNCS(KIND, CODE)                                                                   \
    nvmlReturn_t nvmlDeviceGet##KIND##RunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) { \
        return list_procs("nvmlDeviceGet" #KIND "RunningProcesses", d, CODE, c, i, 1);           \
    }                                                                                            \
    nvmlReturn_t nvmlDeviceGet##KIND##RunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { \
        return list_procs("nvmlDeviceGet" #KIND "RunningProcesses_v2", d, CODE, c, i, 2);        \
    }
#define PROC_FUNCS_V3(KIND, CODE)                                                                \
    nvmlReturn_t nvmlDeviceGet##KIND##RunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { \
        return list_procs("nvmlDeviceGet" #KIND "RunningProcesses_v3", d, CODE, c, i, 3);        \
    }

PROC_FUNCS(Compute, 0)
PROC_FUNCS(Graphics, 1)
PROC_FUNCS(MPSCompute, 2)
#ifndef NVML_STUB_NO_V3
PROC_FUNCS_V3(Compute, 0)
PROC_FUNCS_V3(Graphics, 1)
PROC_FUNCS_V3(MPSCompute, 2)
#endif

static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);   /* the driver stamps samples with the CPU's wall clock, in µs */
    return (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *util,
                                             unsigned int *count, unsigned long long lastSeen) {
    nvmlReturn_t ret = enter("nvmlDeviceGetProcessUtilization", d);
    if (ret) return ret;
    if (d->mig_parent >= 0 || d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;
    int slot = dev_slot(d);
    unsigned long long now = now_us();
    unsigned int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nsample; i++) {
        struct sample *s = &samples[i];
        unsigned long long ts = s->age_us >= 0 ? now - (unsigned long long)s->age_us : s->ts;
        if (s->dev != slot || ts <= lastSeen) continue;
        if (util && n < *count) {
            nvmlProcessUtilizationSample_t *o = util + n;
            o->pid = s->pid; o->timeStamp = ts; o->smUtil = s->sm;
            o->memUtil = s->sm / 2; o->encUtil = 0; o->decUtil = 0;
        }
        n++;
    }
    pthread_mutex_unlock(&lock);
    if (n == 0) return NVML_ERROR_NOT_FOUND;   /* nothing newer than lastSeen */
    if (!util || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    *count = n;
    return NVML_SUCCESS;
}

/* --- MIG --------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    nvmlReturn_t ret = enter("nvmlDeviceGetMigMode", d);
    if (ret) return ret;
    if (!d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;   /* as a pre-Ampere GPU answers */
    *current = *pending = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    nvmlReturn_t ret = enter("nvmlDeviceGetMaxMigDeviceCount", d);
    if (ret == NVML_SUCCESS) *count = d->mig_mode ? MAX_MIG : 0;
    return ret;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    nvmlReturn_t ret = enter("nvmlDeviceGetMigDeviceHandleByIndex", d);
    if (ret) return ret;
    int slot = dev_slot(d);
    if (slot < 0 || slot >= MAX_DEV || index >= MAX_MIG) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t m = mig_dev(slot, (int)index);
    if (!m->used) return NVML_ERROR_NOT_FOUND;   /* an empty slot */
    *mig = m;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    nvmlReturn_t ret = enter("nvmlDeviceIsMigDeviceHandle", d);
    if (ret == NVML_SUCCESS) *is_mig = d->mig_parent >= 0;
    return ret;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    nvmlReturn_t ret = enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", d);
    if (ret) return ret;
    if (d->mig_parent < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = &devs[d->mig_parent];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    nvmlReturn_t ret = enter("nvmlDeviceGetGpuInstanceId", d);
    if (ret) return ret;
    if (d->mig_parent < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    nvmlReturn_t ret = enter("nvmlDeviceGetComputeInstanceId", d);
    if (ret) return ret;
    if (d->mig_parent < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = d->ci;
    return NVML_SUCCESS;
}

/* --- health: temperature, clock event reasons, ECC, remapped rows, events --------------------- */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    nvmlReturn_t ret = enter("nvmlDeviceGetTemperature", d);
    if (ret) return ret;
    if (sensor != 0 || d->mig_parent >= 0) return NVML_ERROR_NOT_SUPPORTED;   /* NVML_TEMPERATURE_GPU only */
    *temp = d->temp;
    return NVML_SUCCESS;
}

static nvmlReturn_t reasons(const char *fn, nvmlDevice_t d, unsigned long long *mask) {
    nvmlReturn_t ret = enter(fn, d);
    if (ret == NVML_SUCCESS) *mask = d->throttle;
    return ret;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *mask) {
    return reasons("nvmlDeviceGetCurrentClocksEventReasons", d, mask);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *mask) {
    return reasons("nvmlDeviceGetCurrentClocksThrottleReasons", d, mask);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int errorType, int counterType,
                                         unsigned long long *count) {
    nvmlReturn_t ret = enter("nvmlDeviceGetTotalEccErrors", d);
    if (ret) return ret;
    if (errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->ecc[errorType][counterType];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    nvmlReturn_t ret = enter("nvmlDeviceGetRemappedRows", d);
    if (ret) return ret;
    *corr = d->remap_corr; *unc = d->remap_unc; *pending = d->remap_pending; *failure = d->remap_failure;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    nvmlReturn_t ret = enter("nvmlDeviceGetSupportedEventTypes", d);
    if (ret == NVML_SUCCESS) *types = d->event_types;
    return ret;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t ret = enter("nvmlEventSetCreate", NULL);
    if (ret) return ret;
    *set = calloc(1, sizeof **set);
    if (!*set) return NVML_ERROR_UNKNOWN;
    (*set)->used = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t ret = enter("nvmlDeviceRegisterEvents", d);
    if (ret) return ret;
    if (!set || !set->used) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~d->event_types) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[dev_slot(d)] |= types;
    return NVML_SUCCESS;
}

/* The next event of the state file for a device and type the set registered (each event is given
 * out once, in file order); none: wait up to the timeout (at most 200 ms here) and say Timeout. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    nvmlReturn_t ret = enter("nvmlEventSetWait_v2", NULL);
    if (ret) return ret;
    if (!set || !set->used) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    while (events_delivered < nevent) {
        struct event *e = &events[events_delivered++];
        if (e->dev >= 0 && (set->mask[e->dev] & e->type)) {
            nvmlDevice_t owner = &devs[e->dev];
            data->device = owner; data->eventType = e->type; data->eventData = e->data;
            data->gpuInstanceId = owner->mig_parent >= 0 ? owner->gi : 0xFFFFFFFFu;
            data->computeInstanceId = owner->mig_parent >= 0 ? owner->ci : 0xFFFFFFFFu;
            pthread_mutex_unlock(&lock);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    unsigned int ms = timeoutms < 200 ? timeoutms : 200;
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
    return 10;   /* NVML_ERROR_TIMEOUT */
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    nvmlReturn_t ret = enter("nvmlEventSetFree", NULL);
    if (ret) return ret;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    free(set);
    return NVML_SUCCESS;
}

/* --- health: PCI identity, violation time, PCIe replays, retired pages, NVLink errors ---------- */

typedef struct {
    char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    nvmlReturn_t ret = enter("nvmlDeviceGetPciInfo_v3", d);
    if (ret) return ret;
    nvmlDevice_t g = d->mig_parent >= 0 ? &devs[d->mig_parent] : d;
    memset(pci, 0, sizeof *pci);
    pci->domain = g->pci_domain; pci->bus = g->pci_bus; pci->device = g->pci_dev;
    pci->pciDeviceId = 0x233010DEu;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", g->pci_domain, g->pci_bus, g->pci_dev);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", g->pci_domain, g->pci_bus, g->pci_dev);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(d, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(d, pci); }

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t d, int policy, nvmlViolationTime_t *t) {
    nvmlReturn_t ret = enter("nvmlDeviceGetViolationStatus", d);
    if (ret) return ret;
    if (policy < 0 || policy > 5) return NVML_ERROR_NOT_SUPPORTED;
    t->referenceTime = now_us(); t->violationTime = d->viol_ns[policy];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *value) {
    nvmlReturn_t ret = enter("nvmlDeviceGetPcieReplayCounter", d);
    if (ret == NVML_SUCCESS) *value = d->replay;
    return ret;
}

/* cause 0: multiple single-bit errors, 1: a double-bit error; the addresses are made up */
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count,
                                       unsigned long long *addresses) {
    nvmlReturn_t ret = enter("nvmlDeviceGetRetiredPages", d);
    if (ret) return ret;
    if (cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = d->retired[cause];
    if (!addresses || *count < n) { *count = n; return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS; }
    for (unsigned int i = 0; i < n; i++) addresses[i] = 0x1000ULL * (i + 1);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *pending) {
    nvmlReturn_t ret = enter("nvmlDeviceGetRetiredPagesPendingStatus", d);
    if (ret == NVML_SUCCESS) *pending = (int)d->retired_pending;
    return ret;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter,
                                             unsigned long long *value) {
    nvmlReturn_t ret = enter("nvmlDeviceGetNvLinkErrorCounter", d);
    if (ret) return ret;
    if (link >= d->nvlinks) return NVML_ERROR_NOT_SUPPORTED;
    if (counter < 0 || counter > 3) return NVML_ERROR_INVALID_ARGUMENT;
    *value = d->nvlink_err[counter];
    return NVML_SUCCESS;
}

#define NVML_NVLINK_MAX_LINKS 36   /* nvml.h's, as pynvml has it */

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *isActive) {
    nvmlReturn_t ret = enter("nvmlDeviceGetNvLinkState", d);
    if (ret) return ret;
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    if (link >= d->nvlinks) return NVML_ERROR_NOT_SUPPORTED;
    *isActive = link < 64 && (d->nvlink_off >> link) & 1 ? 0 : 1;
    return NVML_SUCCESS;
}

/* --- GPU Performance Monitoring (GPM) ------------------------------------------------------ */

#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define GPM_METRIC_MAX 477   /* pynvml's NVML_GPM_METRIC_MAX: the length of its metrics array */
#define GPM_SAMPLE_MAGIC 0x47504d53

typedef struct nvmlGpmSample_st {
    unsigned int magic;       /* set while allocated: a freed or foreign pointer is refused */
    int dev;                  /* the device slot it was taken on, -1 before it is */
    unsigned long long ts;    /* when taken, µs */
    unsigned int given;
    double fig[GPM_FIGURES];
} *nvmlGpmSample_t;

typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId; nvmlReturn_t nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics; nvmlGpmSample_t sample1, sample2; nvmlGpmMetric_t metrics[GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *support) {
    nvmlReturn_t ret = enter("nvmlGpmQueryDeviceSupport", d);
    if (ret) return ret;
    if (!support) return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlDevice_t g = d->mig_parent >= 0 ? &devs[d->mig_parent] : d;
    support->isSupportedDevice = (unsigned)g->gpm;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    nvmlReturn_t ret = enter("nvmlGpmSampleAlloc", NULL);
    if (ret) return ret;
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    *sample = calloc(1, sizeof **sample);
    if (!*sample) return NVML_ERROR_UNKNOWN;
    (*sample)->magic = GPM_SAMPLE_MAGIC;
    (*sample)->dev = -1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    nvmlReturn_t ret = enter("nvmlGpmSampleFree", NULL);
    if (ret) return ret;
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

static nvmlReturn_t take_sample(nvmlDevice_t d, nvmlGpmSample_t sample) {
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->gpm) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    sample->dev = dev_slot(d); sample->ts = now_us(); sample->given = d->gpm_given;
    memcpy(sample->fig, d->gpm_fig, sizeof sample->fig);
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t sample) {
    nvmlReturn_t ret = enter("nvmlGpmSampleGet", d);
    if (ret) return ret;
    if (d->mig_parent >= 0 || d->mig_mode) return NVML_ERROR_NOT_SUPPORTED;   /* MIG: per GPU instance */
    return take_sample(d, sample);
}

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gpuInstanceId, nvmlGpmSample_t sample) {
    nvmlReturn_t ret = enter("nvmlGpmMigSampleGet", d);
    if (ret) return ret;
    int slot = dev_slot(d);
    if (slot < 0 || slot >= MAX_DEV || !d->mig_mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->gpm) return NVML_ERROR_NOT_SUPPORTED;
    for (int i = 0; i < MAX_MIG; i++) {
        nvmlDevice_t m = mig_dev(slot, i);
        if (m->used && m->gi == gpuInstanceId) return take_sample(m, sample);
    }
    return NVML_ERROR_NOT_FOUND;   /* no such GPU instance */
}

/* Each requested metric from the two samples (taken on one device, the second later): the mean of
 * their figures, or NOT_SUPPORTED for a metric the device does not give. */
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *get) {
    nvmlReturn_t ret = enter("nvmlGpmMetricsGet", NULL);
    if (ret) return ret;
    if (!get) return NVML_ERROR_INVALID_ARGUMENT;
    if (get->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t a = get->sample1, b = get->sample2;
    if (!a || !b || a->magic != GPM_SAMPLE_MAGIC || b->magic != GPM_SAMPLE_MAGIC || a->dev < 0
        || a->dev != b->dev || b->ts <= a->ts || get->numMetrics > GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int n = 0; n < get->numMetrics; n++) {
        nvmlGpmMetric_t *m = &get->metrics[n];
        m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; m->value = 0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
        for (int i = 0; i < GPM_FIGURES; i++) {
            if (GPM_IDS[i] != m->metricId || !(a->given & b->given & (1u << i))) continue;
            m->value = (a->fig[i] + b->fig[i]) / 2;
            m->nvmlReturn = NVML_SUCCESS;
            m->metricInfo.shortName = m->metricInfo.longName = GPM_KEYS[i];
            m->metricInfo.unit = i < 5 ? "%" : "MiB/sec";
        }
    }
    return NVML_SUCCESS;
}

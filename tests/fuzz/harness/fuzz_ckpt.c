/* libFuzzer harness: the checkpoint loader on a directory the fuzzer writes. The input is a
 * list of files, each "@@FILE <name>\n" followed by its bytes up to the next marker (names are
 * cleaned to [A-Za-z0-9._-]); the seeds are real checkpoints (MANIFEST.json, model shards,
 * model.safetensors.index.json, config.json, trainer.json). Then, on that directory:
 * ddp_ckpt_verify (manifest, sizes, CRC32C), ddp_ckpt_find (the newest step that verifies),
 * ddp_ckpt_load into two destinations of fixed names and shapes (the loader does not
 * re-verify, so it meets every malformed file), and ddp_ckpt_init_from (Hugging Face
 * directories: index or single file, F16/BF16 converted to F32).
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "worker/checkpoint/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char MARK[] = "@@FILE ";

static void clear_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

/* Writes the files the input describes into dir. */
static void unpack(const char *dir, const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *end = p + size;
    size_t ml = sizeof MARK - 1;
    while (p < end) {
        const char *m = memmem(p, (size_t)(end - p), MARK, ml);
        if (!m) return;
        const char *name = m + ml;
        const char *nl = memchr(name, '\n', (size_t)(end - name));
        if (!nl) return;
        const char *body = nl + 1;
        const char *next = memmem(body, (size_t)(end - body), MARK, ml);
        if (!next) next = end;
        char clean[64];
        size_t k = 0;
        for (const char *c = name; c < nl && k < sizeof clean - 1; c++)
            if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                *c == '.' || *c == '_' || *c == '-')
                clean[k++] = *c;
        clean[k] = 0;
        if (k && strcmp(clean, ".") && strcmp(clean, "..")) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, clean);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd >= 0) {
                if (write(fd, body, (size_t)(next - body)) < 0) { /* a short file is fine */
                }
                close(fd);
            }
        }
        p = next;
    }
}

static int copy_fn(void *dst, const void *src, size_t n, void *ctx)
{
    (void)ctx;
    memcpy(dst, src, n);
    return 0;
}

/* libFuzzer's entry point: one input, any bytes; returns 0 (a bug aborts). One thread. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[300];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/step-00000001", fuzz_scratch());
        mkdir(dir, 0700);
    }
    clear_dir(dir);
    unpack(dir, data, size);

    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    (void)ddp_ckpt_verify(dir, &ei);
    static ddp_ckpt_found_t found; /* large: not on the stack */
    (void)ddp_ckpt_find(fuzz_scratch(), -1, &found, &ei); /* resume's choice among step-* */

    /* the seeds' tensors: wte.weight F32 [8,4] and ln_f.bias F32 [4] */
    static float wte[32], lnb[4];
    ddp_ckpt_tensor_t model[2] = {
        {.name = "wte.weight", .dtype = DDP_ST_F32, .ndim = 2, .shape = {8, 4}, .data = wte,
         .nbytes = sizeof wte},
        {.name = "ln_f.bias", .dtype = DDP_ST_F32, .ndim = 1, .shape = {4}, .data = lnb,
         .nbytes = sizeof lnb},
    };
    ddp_ckpt_load_t req = {.model = model, .n_model = 2, .copy = copy_fn};
    (void)ddp_ckpt_load(dir, &req, &ei);
    free(req.config_json);
    free(req.trainer_json);
    (void)ddp_ckpt_init_from(dir, model, 2, copy_fn, NULL, &ei);
    return 0;
}

/* libgpuipc without a usable CUDA driver: the loader reports why in words, the hello declares no
 * GPUs, and every CUDA entry point fails with GPUIPC_E_NO_CUDA (closing fds it was given) instead
 * of crashing. $GPUIPC_LIBCUDA points the loader at a library that does not exist, so the test
 * means the same on machines with a GPU. No broker is needed: nothing here gets that far. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cuda.h"
#include "internal.h"

#define MISSING_LIBCUDA "/nonexistent/gpuipc-test/libcuda.so.1"

/* A connection that never talked to a broker: enough for calls that fail before they would. */
static gpuipc_t *fake_connection(void)
{
        gpuipc_t *c = calloc(1, sizeof(*c));

        CHECK(c);
        c->fd = -1;
        c->device_pref = -1;
        list_init(&c->own);
        list_init(&c->attached);
        list_init(&c->subs);
        list_init(&c->idle);
        return c;
}

static bool fd_is_open(int fd)
{
        return fcntl(fd, F_GETFD) >= 0 || errno != EBADF;
}

/* A failed driver load says why and what to install, and is remembered rather than retried. */
static void test_load_fails_with_reason(void)
{
        CHECK_EQ(cuda_load(), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(strstr(cuda_load_error(), MISSING_LIBCUDA));
        CHECK(strstr(cuda_load_error(), "NVIDIA driver libraries"));
        /* The outcome is remembered, not retried. */
        CHECK_EQ(cuda_load(), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
}

/* Without a driver there are no visible GPUs or devices, and a device check fails with GPUIPC_E_DEVICE. */
static void test_no_devices(void)
{
        char gpus[PROTO_MAX_GPUS][PROTO_MAX_UUID + 1];

        CHECK_EQ(cuda_visible_gpus(gpus, PROTO_MAX_GPUS), 0);
        CHECK_EQ(cuda_device_count(), 0);
        CHECK_EQ(cuda_device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"), (uint64_t)-1);
        CHECK_STREQ(cuda_device_uuid(0), "");
        CHECK_EQ(cuda_check_device(NULL, 0), (uint64_t)(int64_t)GPUIPC_E_DEVICE);
}

/* CU() returns GCU_ERROR_MISSING_ENTRY when nothing was loaded instead of jumping through a NULL pointer. */
static void test_entry_points_absent(void)
{
        /* CU() must not jump through a NULL pointer when nothing was loaded. */
        CHECK_EQ(CU(cuInit, 0), GCU_ERROR_MISSING_ENTRY);
        CHECK_EQ(CU(cuCtxSynchronize), GCU_ERROR_MISSING_ENTRY);
}

/* A CUDA failure becomes GPUIPC_E_CUDA with a message that names the call and, for the common causes, the fix. */
static void test_error_messages(void)
{
        gpuipc_t *c = fake_connection();

        CHECK_EQ(cuda_error(NULL, "cuMemCreate", GCU_ERROR_OUT_OF_MEMORY), (uint64_t)(int64_t)GPUIPC_E_CUDA);
        CHECK_EQ(cuda_error(c, "cuMemCreate", GCU_ERROR_OUT_OF_MEMORY), (uint64_t)(int64_t)GPUIPC_E_CUDA);
        CHECK(strncmp(gpuipc_errmsg(c), "cuMemCreate failed: ", 20) == 0);
        CHECK(strstr(gpuipc_errmsg(c), "free some"));
        cuda_error(c, "cuStreamWaitValue64", GCU_ERROR_MISSING_ENTRY);
        CHECK(strstr(gpuipc_errmsg(c), "driver is too old"));
        cuda_error_why(c, "cuIpcOpenMemHandle", GCU_ERROR_INVALID_CONTEXT, "because");
        CHECK(strstr(gpuipc_errmsg(c), "cuIpcOpenMemHandle failed: "));
        CHECK(strstr(gpuipc_errmsg(c), ": because"));
        free(c);
}

/* gpuipc_cuda_describe without a driver says it is not loaded, lists no device and gives the reason. */
static void test_describe(void)
{
        CudaInfo *info = calloc(1, sizeof(*info));

        CHECK(info);
        CHECK_EQ(gpuipc_cuda_describe(info), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(!info->loaded);
        CHECK_EQ(info->n_devices, 0);
        CHECK(strstr(info->reason, MISSING_LIBCUDA));
        free(info);
}

static void check_alloc_fails(gpuipc_kind_t kind)
{
        gpuipc_t *c = fake_connection();
        gpuipc_buffer_t *b = NULL;

        CHECK_EQ(gpuipc_buffer_alloc(c, kind, 4096, 0, &b), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(!b);
        CHECK(list_empty(&c->own));
        CHECK(strstr(gpuipc_errmsg(c), "could not be loaded"));
        CHECK(strstr(gpuipc_strerror(GPUIPC_E_NO_CUDA), "memfd"));
        free(c);
}

/* Allocating a cuda-vmm buffer without a CUDA driver fails with GPUIPC_E_NO_CUDA and leaves nothing behind. */
static void test_alloc_vmm(void)
{
        check_alloc_fails(GPUIPC_KIND_CUDA_VMM);
}

/* Allocating a cuda-legacy buffer without a CUDA driver fails with GPUIPC_E_NO_CUDA and leaves nothing behind. */
static void test_alloc_legacy(void)
{
        check_alloc_fails(GPUIPC_KIND_CUDA_LEGACY);
}

/* Wrapping device memory without a driver fails with GPUIPC_E_NO_CUDA (a NULL pointer with GPUIPC_E_INVALID) and
 * registers nothing. */
static void test_wrap(void)
{
        gpuipc_t *c = fake_connection();
        gpuipc_buffer_t *b = NULL;

        CHECK_EQ(gpuipc_buffer_wrap_cuda(c, 0x7f0000000000ull, 4096, &b), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(!b);
        CHECK(list_empty(&c->own));
        CHECK_EQ(gpuipc_buffer_wrap_cuda(c, 0, 4096, &b), (uint64_t)(int64_t)GPUIPC_E_INVALID);
        free(c);
}

/* The consumer's import owns the fd it is given, even when it cannot use it. */
static void check_import_closes_fd(const KindOps *ops, gpuipc_kind_t kind)
{
        static const char handle[PROTO_LEGACY_HANDLE_SIZE];
        gpuipc_t *c = fake_connection();
        ProtoMsg reply = { .kind = (ProtoKind)kind, .size = 4096 };
        Mapping m = { .kind = kind, .size = 4096, .ordinal = -1 };
        int fds[2];

        reply.device = proto_str("GPU-00000000-0000-0000-0000-000000000000");
        reply.handle = (ProtoStr){ handle, sizeof(handle) };
        CHECK(pipe(fds) == 0);
        CHECK_EQ(ops->import(c, &m, &reply, fds[0]), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(!fd_is_open(fds[0]));
        CHECK(!m.ptr);
        CHECK(strstr(gpuipc_errmsg(c), "could not be loaded"));
        close(fds[1]);
        free(c);
}

/* A cuda-vmm import without a driver fails and still closes the fd it was given. */
static void test_import_vmm(void)
{
        check_import_closes_fd(&kind_cuda_vmm_ops, GPUIPC_KIND_CUDA_VMM);
}

/* A cuda-legacy import without a driver fails and still closes the fd it was given. */
static void test_import_legacy(void)
{
        check_import_closes_fd(&kind_cuda_legacy_ops, GPUIPC_KIND_CUDA_LEGACY);
}

/* Both CUDA kinds' copies report GPUIPC_E_NO_CUDA instead of calling a driver that is not there. */
static void test_copy(void)
{
        uint64_t host = 0;

        CHECK_EQ(kind_cuda_vmm_ops.copy((void *)0x1000, 0, &host, sizeof(host), true),
                 (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK_EQ(kind_cuda_legacy_ops.copy((void *)0x1000, 0, &host, sizeof(host), false),
                 (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
}

/* Fences without a driver fail with GPUIPC_E_NO_CUDA before any buffer is made or attach sent. */
static void test_fence(void)
{
        gpuipc_t *c = fake_connection();
        gpuipc_fence_t *f = NULL;

        CHECK_EQ(gpuipc_fence_create(c, "fence", 0, &f), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(!f);
        CHECK(list_empty(&c->own));
        /* Refused before any attach is sent (this connection has no broker to send it to). */
        CHECK_EQ(gpuipc_fence_open(c, "fence", 0, &f), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(!f);
        CHECK(strstr(gpuipc_errmsg(c), "could not be loaded"));
        gpuipc_fence_close(NULL);
        free(c);
}

/* Runs fn in a child whose loader sees $GPUIPC_LIBCUDA = lib (NULL: unset), and checks it
 * exited 0: the load outcome is per process. */
static void in_child(const char *lib, void (*fn)(void))
{
        int status = 0;
        pid_t pid = fork();

        CHECK(pid >= 0);
        if (pid == 0) {
                if (lib)
                        setenv("GPUIPC_LIBCUDA", lib, 1);
                else
                        unsetenv("GPUIPC_LIBCUDA");
                fn();
                _exit(0);
        }
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void not_a_driver(void)
{
        CHECK_EQ(cuda_load(), (uint64_t)(int64_t)GPUIPC_E_NO_CUDA);
        CHECK(strstr(cuda_load_error(), "lacks the basic CUDA driver entry points"));
}

static void default_library(void)
{
        /* With a driver installed this loads; without one the reason names libcuda.so.1. */
        if (cuda_load() < 0)
                CHECK(strstr(cuda_load_error(), "libcuda.so.1"));
        else
                CHECK_STREQ(cuda_load_error(), "");
}

/* A $GPUIPC_LIBCUDA that is some other library (libc) is refused as lacking the CUDA entry points. */
static void test_library_without_cuda(void)
{
        in_child("libc.so.6", not_a_driver);
}

/* With $GPUIPC_LIBCUDA unset the library loads libcuda.so.1 if present, and otherwise says it was libcuda.so.1 it
 * could not load. */
static void test_default_library(void)
{
        in_child(NULL, default_library);
}

int main(int argc, char **argv)
{
        /* Before anything loads: the forked tests set their own. */
        setenv("GPUIPC_LIBCUDA", MISSING_LIBCUDA, 1);
        TEST_RUN(argc, argv, test_library_without_cuda);
        TEST_RUN(argc, argv, test_default_library);
        TEST_RUN(argc, argv, test_load_fails_with_reason);
        TEST_RUN(argc, argv, test_no_devices);
        TEST_RUN(argc, argv, test_entry_points_absent);
        TEST_RUN(argc, argv, test_error_messages);
        TEST_RUN(argc, argv, test_describe);
        TEST_RUN(argc, argv, test_alloc_vmm);
        TEST_RUN(argc, argv, test_alloc_legacy);
        TEST_RUN(argc, argv, test_wrap);
        TEST_RUN(argc, argv, test_import_vmm);
        TEST_RUN(argc, argv, test_import_legacy);
        TEST_RUN(argc, argv, test_copy);
        TEST_RUN(argc, argv, test_fence);
        return TEST_END();
}

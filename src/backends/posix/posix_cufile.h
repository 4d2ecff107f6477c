/*
 * posix backend: the part of libcufile's ABI (GPUDirect Storage) that
 * posix_gds.c calls. kvlane is built without the CUDA toolkit: these are our
 * own declarations with the layouts and values of the public cufile.h
 * (GDS 1.x, CUDA 11.4 to 13). Nothing here is called directly: posix_gds.c
 * dlopens the library and resolves each entry point by name.
 */
#ifndef KVLI_POSIX_CUFILE_H
#define KVLI_POSIX_CUFILE_H

#include <stddef.h>
#include <sys/types.h>

/* CUfileError_t: a cuFile status (0 or 5000 + n) and, when that status is
 * CUDA_DRIVER_ERROR (5011), the CUresult. Returned by value. */
typedef struct kvli_cufile_status {
    int err;
    int cu_err;
} kvli_cufile_status_t;

#define KVLI_CUFILE_BASE_ERR 5000
#define KVLI_CUFILE_DRIVER_NOT_INITIALIZED 5001
#define KVLI_CUFILE_CUDA_DRIVER_ERROR 5011
#define KVLI_CUFILE_HANDLE_TYPE_OPAQUE_FD 1

/* CUfileDescr_t: which kind of handle (an fd), the handle, and an optional
 * file system ops table (NULL: cuFile finds the file system itself). */
typedef struct kvli_cufile_descr {
    int type;
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} kvli_cufile_descr_t;

typedef void *kvli_cufile_handle_t;

/* CUfileDrvProps_t, the members read here; the library writes the whole
 * structure, whose tail grew across versions: pad for later ones. */
typedef union kvli_cufile_props {
    struct {
        struct {
            unsigned int major_version;   /* nvidia-fs; 0.0 when it is not loaded */
            unsigned int minor_version;
            size_t poll_thresh_size;
            size_t max_direct_io_size;
            unsigned int dstatusflags;
            unsigned int dcontrolflags;   /* bits: 1 << KVLI_CUFILE_CTL_* */
        } nvfs;
        unsigned int fflags;
        unsigned int max_device_cache_size;
        unsigned int per_buffer_cache_size;
        unsigned int max_device_pinned_mem_size; /* KiB */
    } p;
    unsigned char pad[512];
} kvli_cufile_props_t;

#define KVLI_CUFILE_CTL_ALLOW_COMPAT 1   /* CU_FILE_ALLOW_COMPAT_MODE */
#define KVLI_CUFILE_FEATURE_P2PDMA 4     /* fflags bit: CU_FILE_P2P_SUPPORTED (PCI P2PDMA) */

/* The entry points posix resolves; NULL where the library lacks an optional
 * one (GetProperties, GetVersion, BufRegister/BufDeregister). */
typedef struct kvli_cufile_api {
    kvli_cufile_status_t (*DriverOpen)(void);
    kvli_cufile_status_t (*DriverClose)(void);   /* cuFileDriverClose_v2 or cuFileDriverClose */
    kvli_cufile_status_t (*DriverGetProperties)(kvli_cufile_props_t *props);
    kvli_cufile_status_t (*GetVersion)(int *version);  /* 1000 * major + 10 * minor */
    kvli_cufile_status_t (*HandleRegister)(kvli_cufile_handle_t *fh, kvli_cufile_descr_t *d);
    void (*HandleDeregister)(kvli_cufile_handle_t fh);
    kvli_cufile_status_t (*BufRegister)(const void *base, size_t len, int flags);
    kvli_cufile_status_t (*BufDeregister)(const void *base);
    ssize_t (*Read)(kvli_cufile_handle_t fh, void *base, size_t size, off_t file_off,
                    off_t buf_off);
    ssize_t (*Write)(kvli_cufile_handle_t fh, const void *base, size_t size, off_t file_off,
                     off_t buf_off);
} kvli_cufile_api_t;

#endif

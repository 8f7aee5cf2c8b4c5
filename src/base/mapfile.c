/* mapfile.c - mmap of a whole file; see mapfile.h. */
#include "base/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int cn_mapfile_open(cn_mapfile *m, const char *path, cn_err *err) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int code = errno == ENOENT ? CN_ENOENT : CN_EIO;
        return cn_err_set(err, code, "%s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cn_err_set(err, CN_EIO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cn_err_set(err, CN_EIO, "%s: mmap failed: %s", path, strerror(e));
        }
        /* Large folios for the page cache behind it, so the weights map in 2 MiB pages where
         * the kernel and filesystem allow (ext4 on 6.x does). A decode token of nano-shape reads
         * 2.9 GB scattered over 19 GB of experts: in 4 KiB pages each page's walk missed the
         * caches and the streams restarted at every page. Whole nano-shape NVFP4 on this 2-core
         * machine, the file read in afresh: 4.9-5.3 tok/s (0.26-0.28 of the roofline) without,
         * 13.5 with (0.57); once the page cache holds large folios every mapping gets them. The
         * advice is only a hint: a kernel without it maps 4 KiB pages as before. */
        (void)madvise(p, (size_t)st.st_size, MADV_HUGEPAGE);
        m->data = p;
        m->size = (uint64_t)st.st_size;
    }
    close(fd);
    return CN_OK;
}

void cn_mapfile_close(cn_mapfile *m) {
    if (m->data) munmap((void *)m->data, (size_t)m->size);
    m->data = NULL;
    m->size = 0;
}

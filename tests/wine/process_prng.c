/* bcryptprimitives.dll with the one function Wine 8.0 lacks: ProcessPrng, which Rust's standard
 * library imports on Windows for its random seeds. Forwards to RtlGenRandom (advapi32's
 * SystemFunction036), which Wine has. Placed beside the test executables under Wine only; real
 * Windows 10+ has its own. Built by tests/wine/setup.sh. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length) {
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk)) return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}

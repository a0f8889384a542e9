/* A test-harness shim for Wine only. Rust's Windows standard library imports ProcessPrng from
 * bcryptprimitives.dll, which Wine 8.0 (Debian 12) does not have, so no Rust .exe starts under
 * it. Placed next to flotilla.exe, this DLL provides ProcessPrng through RtlGenRandom
 * (advapi32's SystemFunction036). Real Windows has the DLL; nothing ships this file. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}

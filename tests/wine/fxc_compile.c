/* Compiles HLSL compute shaders with Microsoft's FXC (d3dcompiler_47.dll), as wgpu's DX12
 * backend does when no DXC is installed: shader model 5.1, D3DCOMPILE_ENABLE_STRICTNESS.
 *
 * Usage: fxc_compile.exe D3DCOMPILER_DLL MANIFEST [skip-optimization]
 * Each MANIFEST line is "ENTRY_POINT FILE.hlsl". Prints "ok FILE" or "error FILE" followed by
 * the compiler's messages; exits 1 when any file fails, 2 on a usage or I/O problem.
 * skip-optimization adds D3DCOMPILE_SKIP_OPTIMIZATION: the same parsing and flow-control checks
 * (error X4026 included) in a fraction of the time, without the optimizer's own failures.
 * Built with mingw-w64 and run under Wine by tests/shader_portability.rs (tests/wine/setup.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define COBJMACROS
#include <windows.h>
#include <d3dcompiler.h>

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc(len + 1);
    if (data && fread(data, 1, len, f) != (size_t)len) {
        free(data);
        data = NULL;
    }
    fclose(f);
    if (data) {
        data[len] = 0;
        *size = (size_t)len;
    }
    return data;
}

int main(int argc, char **argv) {
    UINT flags = D3DCOMPILE_ENABLE_STRICTNESS;
    if (argc == 4 && strcmp(argv[3], "skip-optimization") == 0) {
        flags |= D3DCOMPILE_SKIP_OPTIMIZATION;
    } else if (argc != 3) {
        fprintf(stderr, "usage: fxc_compile D3DCOMPILER_DLL MANIFEST [skip-optimization]\n");
        return 2;
    }
    HMODULE dll = LoadLibraryA(argv[1]);
    if (!dll) {
        fprintf(stderr, "could not load %s (error %lu)\n", argv[1], GetLastError());
        return 2;
    }
    pD3DCompile compile = (pD3DCompile)(void *)GetProcAddress(dll, "D3DCompile");
    if (!compile) {
        fprintf(stderr, "%s has no D3DCompile\n", argv[1]);
        return 2;
    }
    FILE *manifest = fopen(argv[2], "r");
    if (!manifest) {
        fprintf(stderr, "could not open %s\n", argv[2]);
        return 2;
    }
    char entry[256], path[4096];
    int failed = 0, compiled = 0;
    while (fscanf(manifest, "%255s %4095s", entry, path) == 2) {
        size_t size = 0;
        char *source = read_file(path, &size);
        if (!source) {
            fprintf(stderr, "could not read %s\n", path);
            return 2;
        }
        ID3DBlob *code = NULL, *errors = NULL;
        HRESULT hr = compile(source, size, path, NULL, NULL, entry, "cs_5_1", flags, 0, &code, &errors);
        printf("%s %s\n", SUCCEEDED(hr) ? "ok" : "error", path);
        if (errors) {
            if (FAILED(hr)) fwrite(ID3D10Blob_GetBufferPointer(errors), 1, ID3D10Blob_GetBufferSize(errors), stdout);
            ID3D10Blob_Release(errors);
        }
        if (code) ID3D10Blob_Release(code);
        if (FAILED(hr)) failed++;
        compiled++;
        free(source);
        fflush(stdout);
    }
    fclose(manifest);
    printf("%d of %d shaders compiled\n", compiled - failed, compiled);
    return failed ? 1 : 0;
}

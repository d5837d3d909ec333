// A library that looks like libamdhip64 but lacks hipGetDevicePropertiesR0600 (as an old ROCm).
extern "C" {
int hipModuleLoadData(void**, const void*) { return 0; }
int hipModuleGetFunction(void**, void*, const char*) { return 0; }
int hipModuleUnload(void*) { return 0; }
int hipModuleLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, void*, void**, void**) { return 0; }
const char* hipGetErrorString(int) { return "x"; }
int hipGetDevice(int*) { return 0; }
int hipSetDevice(int) { return 0; }
}

// A stand-in for libamdhip64, for testing jax_mla's HIP launcher without a GPU: it implements
// the few entry points the launcher resolves, records what it was asked to do, and lets the test
// choose the device arch and inject errors (through the fake_* functions, read with ctypes).
#include <cstdint>
#include <cstring>

extern "C" {

static char g_arch[256] = "gfx950:sramecc+:xnack-";
static int g_fail_launch = 0, g_fail_load = 0, g_fail_symbol = 0;
static int g_loads = 0, g_unloads = 0, g_launches = 0, g_current_device = 0,
           g_set_device_calls = 0;
static unsigned g_grid[3], g_block[3], g_shared;
static void* g_stream;
static void* g_params;
static unsigned char g_kernargs[1024];
static std::size_t g_kernarg_size;
static char g_symbol[256];
static unsigned char g_image_head[16];
static int g_module_device = -1;

void fake_set_arch(const char* arch) { std::strncpy(g_arch, arch, 255); }
void fake_fail(int load, int launch) { g_fail_load = load; g_fail_launch = launch; }
void fake_fail_symbol(int code) { g_fail_symbol = code; }  // hipModuleGetFunction's error
int fake_loads() { return g_loads; }
int fake_unloads() { return g_unloads; }
int fake_launches() { return g_launches; }
int fake_module_device() { return g_module_device; }
int fake_current_device() { return g_current_device; }
const char* fake_symbol() { return g_symbol; }
const unsigned char* fake_image_head() { return g_image_head; }
void fake_last_launch(unsigned* geometry, void** stream, void** params, unsigned char* kernargs,
                      std::size_t* size) {
  for (int i = 0; i < 3; ++i) geometry[i] = g_grid[i], geometry[3 + i] = g_block[i];
  geometry[6] = g_shared;
  *stream = g_stream;
  *params = g_params;
  std::memcpy(kernargs, g_kernargs, g_kernarg_size);
  *size = g_kernarg_size;
}
void fake_reset() {
  g_loads = g_unloads = g_launches = g_set_device_calls = 0;
  g_current_device = 0;
}

int hipModuleLoadData(void** module, const void* image) {
  if (g_fail_load) return g_fail_load;
  std::memcpy(g_image_head, image, 16);
  g_module_device = g_current_device;
  ++g_loads;
  *module = reinterpret_cast<void*>(0x1000 + g_loads);
  return 0;
}
int hipModuleGetFunction(void** function, void* module, const char* name) {
  std::strncpy(g_symbol, name, 255);
  if (g_fail_symbol) return g_fail_symbol;
  *function = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(module) + 0x10);
  return 0;
}
int hipModuleUnload(void* module) {
  ++g_unloads;
  return module != nullptr ? 0 : 1;
}
int hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  if (g_fail_launch) return g_fail_launch;
  g_grid[0] = gx, g_grid[1] = gy, g_grid[2] = gz;
  g_block[0] = bx, g_block[1] = by, g_block[2] = bz;
  g_shared = shared;
  g_stream = stream;
  g_params = params;
  // extra = {BUFFER_POINTER(1), buf, BUFFER_SIZE(2), &size, END(3)}, as HIP parses it.
  if (extra[0] != reinterpret_cast<void*>(1) || extra[2] != reinterpret_cast<void*>(2) ||
      extra[4] != reinterpret_cast<void*>(3)) {
    return 1;  // hipErrorInvalidValue
  }
  g_kernarg_size = *static_cast<std::size_t*>(extra[3]);
  if (g_kernarg_size > sizeof(g_kernargs)) return 1;
  std::memcpy(g_kernargs, extra[1], g_kernarg_size);
  ++g_launches;
  return 0;
}
const char* hipGetErrorString(int code) {
  switch (code) {
    case 1: return "hipErrorInvalidValue";
    case 98: return "hipErrorInvalidImage";
    case 101: return "hipErrorInvalidDevice";
    case 500: return "hipErrorNotFound";
    case 719: return "hipErrorLaunchFailure";
    default: return "hipErrorOther";
  }
}
int hipGetDevicePropertiesR0600(void* props, int device) {
  if (device < 0 || device > 7) return 101;  // hipErrorInvalidDevice
  std::memset(props, 0, 1472);
  std::memcpy(static_cast<char*>(props) + 1160, g_arch, std::strlen(g_arch) + 1);
  return 0;
}
int hipGetDevice(int* device) { *device = g_current_device; return 0; }
int hipSetDevice(int device) { g_current_device = device; ++g_set_device_calls; return 0; }
}

// Which ways of making a programmatic (PDL) edge between two kernels of a cuModuleLoad'ed CUBIN
// the driver accepts in a captured graph: (a) rewriting a captured plain edge with
// cuGraphRemoveDependencies + cuGraphAddDependencies (edge data: programmatic type, from port
// PROGRAMMATIC or LAUNCH_ORDER), (b) capturing the second launch with cuLaunchKernelEx and
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, (c) (a) through the symbols cudarc
// loads, (d) both ways with an allocation node in the capture. Each graph is instantiated, launched
// and its result checked. Build: nvcc -cubin -arch=sm_90 kernels.cu -o kernels.cubin &&
// g++ probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o probe
#include <cuda.h>
#include <cstdio>
#include <vector>
#include <dlfcn.h>

#define N 4096
static const char* name(CUresult r) { const char* s = nullptr; cuGetErrorName(r, &s); return s ? s : "?"; }
#define TRY(what, call) do { CUresult r_ = (call); printf("  %-52s %s\n", what, name(r_)); if (r_ != CUDA_SUCCESS) return false; } while (0)

static CUfunction prod, cons;
static CUdeviceptr x, y;
static CUstream s;

static void launch_plain(CUfunction f, void** args) { cuLaunchKernel(f, N / 256, 1, 1, 256, 1, 1, 0, s, args, nullptr); }

static bool check(CUgraph g, int v) {
    CUgraphExec e;
    TRY("instantiate", cuGraphInstantiate(&e, g, 0));
    TRY("launch", cuGraphLaunch(e, s));
    TRY("synchronize", cuStreamSynchronize(s));
    std::vector<int> h(N);
    cuMemcpyDtoH(h.data(), y, N * sizeof(int));
    int bad = 0;
    for (int i = 0; i < N; ++i) bad += h[i] != v + 1;
    printf("  %-52s %s\n", "result", bad ? "WRONG" : "right");
    cuGraphExecDestroy(e);
    return bad == 0;
}

static bool rewrite(unsigned char port, int v) {
    printf("(a) rewrite a captured edge, from port %d\n", port);
    CUgraph g;
    void* pa[] = {&x, &v};
    void* ca[] = {&x, &y};
    TRY("begin capture", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    launch_plain(prod, pa);
    launch_plain(cons, ca);
    TRY("end capture", cuStreamEndCapture(s, &g));
    size_t n = 0;
    TRY("get edges (count)", cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
    std::vector<CUgraphNode> from(n), to(n);
    std::vector<CUgraphEdgeData> data(n);
    TRY("get edges", cuGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
    printf("  %zu edge(s)\n", n);
    CUgraphEdgeData plain = {};
    TRY("remove plain edge", cuGraphRemoveDependencies(g, &from[0], &to[0], &plain, 1));
    CUgraphEdgeData e = {};
    e.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    e.from_port = port;
    TRY("add programmatic edge", cuGraphAddDependencies(g, &from[0], &to[0], &e, 1));
    return check(g, v);
}

static bool captured(int v) {
    printf("(b) capture with cuLaunchKernelEx + programmatic stream serialization\n");
    CUgraph g;
    void* pa[] = {&x, &v};
    void* ca[] = {&x, &y};
    TRY("begin capture", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    launch_plain(prod, pa);
    CUlaunchAttribute at = {};
    at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    at.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig c = {};
    c.gridDimX = N / 256; c.gridDimY = 1; c.gridDimZ = 1;
    c.blockDimX = 256; c.blockDimY = 1; c.blockDimZ = 1;
    c.hStream = s; c.attrs = &at; c.numAttrs = 1;
    TRY("launch ex (captured)", cuLaunchKernelEx(&c, cons, ca, nullptr));
    TRY("end capture", cuStreamEndCapture(s, &g));
    size_t n = 0;
    TRY("get edges (count)", cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
    std::vector<CUgraphNode> from(n), to(n);
    std::vector<CUgraphEdgeData> data(n);
    TRY("get edges", cuGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
    for (size_t i = 0; i < n; ++i) printf("  edge %zu: type %d from_port %d\n", i, data[i].type, data[i].from_port);
    return check(g, v);
}

// (c) as (a), but every call through the `_v2` symbols as cudarc loads them (dlsym on
// libcuda.so.1), with the node checks graphs.rs makes: node type, kernel parameters, module.
static bool symbols(int v) {
    printf("(c) the _v2 symbols by dlsym, with the node checks graphs.rs makes\n");
    void* lib = dlopen("libcuda.so.1", RTLD_NOW);
    typedef CUresult (*Edges)(CUgraph, CUgraphNode*, CUgraphNode*, CUgraphEdgeData*, size_t*);
    typedef CUresult (*Deps)(CUgraph, const CUgraphNode*, const CUgraphNode*, const CUgraphEdgeData*, size_t);
    typedef CUresult (*Params)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2*);
    Edges get_edges = (Edges)dlsym(lib, "cuGraphGetEdges_v2");
    Deps remove = (Deps)dlsym(lib, "cuGraphRemoveDependencies_v2");
    Deps add = (Deps)dlsym(lib, "cuGraphAddDependencies_v2");
    Params params = (Params)dlsym(lib, "cuGraphKernelNodeGetParams_v2");
    printf("  symbols: edges %p remove %p add %p params %p\n", (void*)get_edges, (void*)remove, (void*)add, (void*)params);
    if (!get_edges || !remove || !add || !params) return false;
    CUgraph g;
    void* pa[] = {&x, &v};
    void* ca[] = {&x, &y};
    TRY("begin capture", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    launch_plain(prod, pa);
    launch_plain(cons, ca);
    TRY("end capture", cuStreamEndCapture(s, &g));
    size_t n = 0;
    TRY("cuGraphGetEdges_v2 (count)", get_edges(g, nullptr, nullptr, nullptr, &n));
    std::vector<CUgraphNode> from(n), to(n);
    std::vector<CUgraphEdgeData> data(n);
    TRY("cuGraphGetEdges_v2", get_edges(g, from.data(), to.data(), data.data(), &n));
    CUgraphNodeType t;
    TRY("cuGraphNodeGetType", cuGraphNodeGetType(to[0], &t));
    CUDA_KERNEL_NODE_PARAMS_v2 p = {};
    TRY("cuGraphKernelNodeGetParams_v2", params(to[0], &p));
    printf("  func %p kern %p\n", (void*)p.func, (void*)p.kern);
    CUmodule mod = nullptr;
    TRY("cuFuncGetModule", cuFuncGetModule(&mod, p.func));
    CUgraphEdgeData plain = {};
    TRY("cuGraphRemoveDependencies_v2", remove(g, &from[0], &to[0], &plain, 1));
    CUgraphEdgeData e = {};
    e.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    e.from_port = CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER;
    TRY("cuGraphAddDependencies_v2 (programmatic)", add(g, &from[0], &to[0], &e, 1));
    return check(g, v);
}

// (d) a capture holding an allocation node (as the engine's do): rewriting an edge afterwards
// (refused, the engine's first attempt), and setting the capture's pending dependency to a
// programmatic edge right before the launch (cuStreamUpdateCaptureDependencies_v2: what
// programmatic.rs does).
static bool with_alloc(int v) {
    printf("(d) a capture with an allocation node\n");
    CUgraph g;
    void* pa[] = {&x, &v};
    void* ca[] = {&x, &y};
    CUdeviceptr tmp;
    TRY("begin capture", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    TRY("alloc (captured)", cuMemAllocAsync(&tmp, 1 << 20, s));
    launch_plain(prod, pa);
    launch_plain(cons, ca);
    TRY("free (captured)", cuMemFreeAsync(tmp, s));
    TRY("end capture", cuStreamEndCapture(s, &g));
    size_t n = 0;
    TRY("get edges (count)", cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
    std::vector<CUgraphNode> from(n), to(n);
    std::vector<CUgraphEdgeData> data(n);
    TRY("get edges", cuGraphGetEdges(g, from.data(), to.data(), data.data(), &n));
    CUgraphEdgeData plain = {};
    CUresult r = cuGraphRemoveDependencies(g, &from[1], &to[1], &plain, 1);
    printf("  %-52s %s\n", "remove an edge afterwards (refusal expected)", name(r));
    cuGraphDestroy(g);
    TRY("begin capture", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    TRY("alloc (captured)", cuMemAllocAsync(&tmp, 1 << 20, s));
    launch_plain(prod, pa);
    CUstreamCaptureStatus st;
    cuuint64_t id;
    CUgraph cg;
    const CUgraphNode* deps;
    const CUgraphEdgeData* ed;
    size_t nd = 0;
    TRY("capture info", cuStreamGetCaptureInfo(s, &st, &id, &cg, &deps, &ed, &nd));
    printf("  %zu pending dependency\n", nd);
    CUgraphNode node = deps[0];
    CUgraphEdgeData e = {};
    e.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    e.from_port = CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER;
    TRY("set it programmatic", cuStreamUpdateCaptureDependencies(s, &node, &e, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    launch_plain(cons, ca);
    TRY("free (captured)", cuMemFreeAsync(tmp, s));
    TRY("end capture", cuStreamEndCapture(s, &g));
    return check(g, v);
}

int main() {
    CUdevice d;
    CUcontext ctx;
    CUmodule m;
    cuInit(0);
    cuDeviceGet(&d, 0);
    cuCtxCreate(&ctx, nullptr, 0, d);
    if (cuModuleLoad(&m, "kernels.cubin") != CUDA_SUCCESS) { printf("no kernels.cubin\n"); return 1; }
    cuModuleGetFunction(&prod, m, "producer");
    cuModuleGetFunction(&cons, m, "consumer");
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    cuMemAlloc(&x, N * sizeof(int));
    cuMemAlloc(&y, N * sizeof(int));
    rewrite(CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, 7);
    rewrite(CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER, 8);
    captured(9);
    symbols(10);
    with_alloc(11);
    return 0;
}

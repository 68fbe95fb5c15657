"""The generic tier (detectors/rules/generic.yaml, `tier: generic`): a failure's shape read where no signature
matched, at a low confidence that says so; never over a signature, never against a signature on the same line,
never in live detection."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from argus.wiring import build_detectors
from core.errors import RuleError
from core.settings import load_settings
from core.types import Category
from detectors.engine import RuleSet, RuleTier, load_rules, root_cause
from detectors.log_rules import LogRuleDetector
from detectors.metric_rules import MetricRuleSet
from rca.analyze import analyze_lines
from rca.classify import GENERIC_CAP, TIER_GENERIC, TIER_ROOT_CAUSE, classify, tier

RULES = load_rules()


def verdict(*lines: str) -> dict:
    return analyze_lines("job.log", list(lines), RULES)


# Lines each generic category must read, in words no signature knows (a cloud's, a launcher's, an old version's).
SHAPES = [
    ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 2.1GiB on device", "gpu_oom"),
    ("RuntimeError: system memory exhausted while loading shard 3 of the dataset", "host_oom"),
    ("pod/trainer-worker-3 terminated: reason OOMKilled, exit code 137", "host_oom"),
    ("ERROR worker node 10.0.3.7 went offline during step 1200", "node_lost"),
    ("Failed to connect to GCS at address 10.0.0.1:6379 within 60 seconds.", "node_lost"),
    ("sky.exceptions: The spot instance was preempted; recovering the cluster", "node_lost"),
    ("RuntimeError: NCCL communicator was aborted on rank 2", "nccl_error"),
    ("torch.distributed.DistNetworkError: failed to recv, got 0 bytes", "nccl_error"),
    ("deepspeed barrier timed out after 1800 seconds on rank 3", "nccl_hang"),
    # a stack dump of a thread inside a torch.distributed call: py-spy's frame, faulthandler's
    ("    send (torch/distributed/distributed_c10d.py:2487)", "nccl_hang"),
    ('  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce',
     "nccl_hang"),
    ("the worker node 10.0.3.7 was detected as dead by the provider", "node_lost"),
    ("kernel: NVRM: Xid (PCI:0000:3b:00): 109, pid=1234, Ch 00000010", "gpu_hardware"),
    ("nvidia-smi has failed because it couldn't communicate with the NVIDIA driver", "gpu_hardware"),
    ("pynvml.nvml.NVMLError_GpuIsLost: GPU is lost", "gpu_hardware"),
    ("E0511 tpunetd_client.cc:311] Detected failure SLICE_FAILURE_CHIP_DRIVER_ERROR in session e6c8; Start failure "
     "handling", "gpu_hardware"),
    ("dcgm health: Detected XID 79 error on GPU 3", "gpu_hardware"),
    # a kernel call trace through the NVIDIA driver (tests/rca_cases/303)
    ("192.168.11.119: kern: warning: [2026-04-22T21:27:51.291078766Z]:  rm_ioctl+0x66/0x4f0 [nvidia]", "gpu_hardware"),
    ("nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 44 egress non-posted PRIV error",
     "gpu_hardware"),
    ("IOError: write to /ckpt/model-00003-of-00004.safetensors: storage is full", "disk_full"),
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
     "disk_full"),
    ("jinja2.exceptions.TemplateError: Conversation roles must alternate user/assistant/user/assistant",
     "user_error"),
    ("(TaskRunner pid=4242) pydantic_core._pydantic_core.ValidationError: 1 validation error for SamplingParams",
     "user_error"),
    # KV cache with no room left, as serving engines print it when the weights took the GPU
    ("(EngineCore_0 pid=5839) INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: -2.14 GiB",
     "gpu_oom"),
    # a library handle that cannot be created on a GPU another process (or the framework's pre-allocation) filled
    ("E cuda_blas.cc:226] failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED", "gpu_oom"),
    ("Check failed: e == CUDNN_STATUS_SUCCESS (4 vs. 0) Could not create cudnn handle: CUDNN_STATUS_INTERNAL_ERROR",
     "gpu_oom"),
    ("INFO worker.py:267] the rest of the memory reserved for KV Cache is -0.42GiB.", "gpu_oom"),
    ("RuntimeError: Insufficient space in /dev/shm: 512 MiB required, 64 MiB free.", "disk_full"),
    # MindSpore's device allocator; TH's CPU allocator (Torch7), whose lower-case "tried to allocate" is the host's
    ("[ERROR] PRE_ACT(145615,fffbdf67f120,python):2025-01-12-09:48:13.703.514 [mem_dynamic_allocator.cc:392] "
     "TotalUsedMemStatistics : 24725382656 plus alloc size : 100555779072 is more than total mem size : 61079552000.",
     "gpu_oom"),
    ("luajit: $ Torch: not enough memory: you tried to allocate 2GB. Buy new RAM! at THGeneral.c:266", "host_oom"),
    ("MemoryError: std::bad_alloc: out_of_memory: RMM failure at:/opt/conda/include/rmm/mr/device/"
     "pool_memory_resource.hpp:196: Maximum pool size exceeded", "gpu_oom"),
    ("concurrent.futures.process.BrokenProcessPool: A process in the process pool was terminated abruptly while the "
     "future was running or pending.", "host_oom"),
    ('Kernel module "ib_umad" has not been loaded, fabric manager cannot be started', "gpu_hardware"),
    # NVIDIA's Kubernetes device plugin; UCX's signal handler on a SIGBUS (shared memory that could not be backed)
    ("2020/08/10 19:09:42 XidCriticalError: Xid=69 on Device=GPU-7540a9b3-eeb9-1214-1526-f93c9ea826a8, the device "
     "will go unhealthy.", "gpu_hardware"),
    ("[node-3:1    :0:381] Caught signal 7 (Bus error: nonexistent physical address)", "disk_full"),
    # NCCL's WARN texts for connections it could not set up (from NCCL's sources)
    ("gpu-1:1234:1234 [0] bootstrap.cc:99 NCCL WARN Bootstrap : failed to open the listening socket", "nccl_error"),
    ("gpu-1:1234:1250 [3] transport.cc:52 NCCL WARN Rank 3 has no transport for connecting peer 5 on channel 0/2",
     "nccl_error"),
    # Ray's system exceptions for objects whose owner or holder is gone: not the job's own error
    ("ray.exceptions.OwnerDiedError: Failed to retrieve object 00ffffffffffffffffffffffffffffffffffffff0100000001. "
     "The object's owner has exited.", "node_lost"),
    ("ray.exceptions.ObjectReconstructionFailedMaxAttemptsExceededError: Failed to retrieve object 00ff. The object "
     "cannot be reconstructed because the maximum number of task retries has been exceeded.", "node_lost"),
    ("Status Reason: Host EC2 (instance i-0abc123def4567890) terminated.", "node_lost"),
    ("WARN Master: Removing worker worker-20250101-10.0.0.5-7078 because we got no heartbeat in 60 seconds",
     "node_lost"),
    ("ORTE has lost communication with its daemon located on node: hostname: gpu-node-12", "node_lost"),
    # CUDA's own text for error code 2, printed bare by a CUDA program
    ("ERROR: out of memory in /opt/app/src/acc/projector_impl.h at line 74 (error-code 2)", "gpu_oom"),
    ("W tensorflow/core/common_runtime/bfc_allocator.cc:267] Allocator (GPU_0_bfc) ran out of memory trying to "
     "allocate 2.00GiB.", "gpu_oom"),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.2 GB)", "gpu_oom"),
    ("java.lang.OutOfMemoryError: Java heap space", "host_oom"),
    # a shell's "Killed" right after a progress bar's last output, with no newline between them
    ("13117/51576 [======>.......] - ETA: 10:02:38 - loss: 5.7555Killed", "host_oom"),
    ("   JobState=PENDING Reason=BadConstraints FailedNode=gpu-dy-4 Dependency=(null)", "node_lost"),
    # a cloud takes a spot VM back by pressing its (ACPI) power key; systemd says so
    ("Jan 30 10:33:08Z gpu-worker-4-1 systemd-logind Power key pressed.", "node_lost"),
    ("Connection to 10.0.3.7 closed by remote host.", "node_lost"),
    ("Warning  NodeNotReady  pod/trainer-worker-2  Node is not ready", "node_lost"),
    ("state: PREEMPTED", "node_lost"),
    ("(autoscaler +44m27s) Instance k-6e0b (node IP: 10.1.39.138) will be terminated soon (reason: "
     "kubernetes-pod-termination).", "node_lost"),
    ("An ORTE daemon has unexpectedly failed after launch and before communicating back to mpirun.", "node_lost"),
    ("Exception: reward function returned None for sample 12", "user_error"),
    # Spark on YARN: a lost executor is a lost machine, unless YARN killed its container for memory
    ("ExecutorLostFailure (executor 3 exited caused by one of the running tasks) Reason: Container marked as failed: "
     "container_1_0003 on host: 10.0.0.5. Exit status: -100. Diagnostics: Container released on a *lost* node",
     "node_lost"),
    ("ExecutorLostFailure (executor 7 exited caused by one of the running tasks) Reason: Container killed by YARN for "
     "exceeding memory limits. 11.0 GB of 11 GB physical memory used.", "host_oom"),
    ("distributed.nanny - WARNING - Worker exceeded 95% memory budget. Restarting", "host_oom"),
    ("sky.exceptions.ClusterNotUpError: Cluster 'train-4' is not up; cannot run job.", "node_lost"),
    # Ray's control plane losing a node at the network level: the GCS's RPCs to it reset
    ("[2024-12-05 07:00:39,285 W 688314 688314] (gcs_server) gcs_server.cc:377: [1] Failed to get the resource load: "
     "RpcError: RPC Error message: recvmsg:Connection reset by peer; RPC Error details:", "node_lost"),
    ("(gcs_server) gcs_health_check_manager.cc:108: Health check failed for node 9f3c, remaining checks 2, status 14, "
     "status message failed to connect to all addresses", "node_lost"),
    # cluster control planes' own words for a machine that stopped answering (Kubernetes' node controller, Open MPI's
    # launcher, Slurm's step launch, a node marked dead in any wording)
    ("Node gpu-node-7 which was running pod trainer-worker-3 is unresponsive", "node_lost"),
    ("Kubelet stopped posting node status.", "node_lost"),
    ("A daemon (pid unknown) died unexpectedly on signal 1  while attempting to launch so we are aborting.",
     "node_lost"),
    ("srun: error: Task launch for StepId=1234.0 failed on node gpu-12: Communication connection failure",
     "node_lost"),
    ("pyarrow.lib.ArrowMemoryError: malloc of size 64 failed", "host_oom"),
    ("tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective ops is aborted by: Deadline Exceeded",
     "nccl_hang"),
    ("deepspeed.runtime.zero.partition_parameters: Timed out waiting for all gather", "nccl_hang"),
    ("Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error", "gpu_hardware"),
    # NVML's error code 15 is NVML_ERROR_GPU_IS_LOST, printed by number by tools that read NVML
    ("WARN: NVML: can't get GPU #2, error code 15", "gpu_hardware"),
    # cudnnCreate failing: the handle's memory could not be had on a full GPU
    ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED", "gpu_oom"),
    # the NVIDIA kernel driver's own failure lines and nvidia-smi's unreadable fields, Vulkan's device OOM, a CI
    # runner that went silent (tests/rca_cases/339, 342, 341, 345)
    ("[   84.300480] NVRM: GPU6 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error detected. "
     "kbusSendSysmembarSingle failed.", "gpu_hardware"),
    ("[   24.302465] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 "
     "heartbeat 1899482", "gpu_hardware"),
    ("|ERR!  ERR! ERR!    ERR! / ERR! |   4184MiB / 23028MiB |    ERR!      Default |", "gpu_hardware"),
    ("vulkan_buffer.cc:61: InternalError: Check failed: (__e == VK_SUCCESS) is false: Vulkan Error, code=-2: "
     "VK_ERROR_OUT_OF_DEVICE_MEMORY", "gpu_oom"),
    ("The self-hosted runner: regression-test-gpu-3 lost communication with the server. Verify the machine is running "
     "and has a healthy network connection.", "node_lost"),
    # Ray's retry of a task whose node the cloud took back (its gcs_server's message)
    ("Task 1a2b failed due to node preemption on node 5c6d. The task will be retried, but the retry will not count "
     "against the normal retry count.", "node_lost"),
    # Ray's words for a process that vanished without a Python error of its own
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.", "node_lost"),
    ("ray.exceptions.WorkerCrashedError: The worker died unexpectedly while executing this task. Check "
     "python-core-worker-*.log files for more information.", "node_lost"),
    # Intel's oneCCL on Intel GPUs: its failures, and its shared-memory transport that could not be created
    ("2024:08:21-10:24:26:( 4456) |CCL_ERROR| atl_ofi.cpp:1036 open_providers: atl_ofi_open_nw_provs failed with "
     "status: 1", "nccl_error"),
    ("2024:08:21-10:24:26:( 4456) |CCL_ERROR| atl_ofi_helper.cpp:907 atl_ofi_get_prov_list: can't create providers "
     "for name shm", "disk_full"),
    # a process ended by SIGBUS however the launcher words it (shared memory that could not be backed)
    ("[launch.py:319:sigkill_handler] Killing subprocess 1234 ... exits with return code = -7", "disk_full"),
    ("/usr/bin/bash: line 1:  4242 Bus error (core dumped) python train.py", "disk_full"),
    # a lost node's words, capitalised or as YARN gives back a container
    ("Lost connection to node 10.0.0.4 while running task 7", "node_lost"),
    ("Container marked as failed: container_1 on host: node7. Exit status: -100. Diagnostics: Container released on "
     "a *lost* node.", "node_lost"),
    # XLA on a TPU that cannot reserve program memory in HBM
    ("Attempting to reserve 3.95G at the bottom of memory. That was not possible. There are 1.92G free.", "gpu_oom"),
    # the coordination service of JAX / TensorFlow that stopped hearing from a task, and a node not alive
    ("Terminating process because the coordinator detected missing heartbeats. This most likely indicates that "
     "another task died.", "node_lost"),
    ("Task /job:jax_worker/replica:0/task:3 heartbeat timeout.", "node_lost"),
    ("Exception: Ray cluster failed: Node 10.1.1.1 is not alive", "node_lost"),
    # a machine shut down under the job, one that became unavailable, a cloud's maintenance, Kubernetes' unknown node
    ("The job was terminated because the machine it was running on was shut down for maintenance.", "node_lost"),
    ("The node gpu-node-3 became unavailable", "node_lost"),
    ("GCE: host maintenance event on instance train-7", "node_lost"),
    ("Warning  NodeStatusUnknown  node/gpu-7  Kubelet stopped reporting", "node_lost"),
    # Kubernetes' node controller taking pods off a node that stopped answering, a container whose node is gone, a node
    # reported failed or lost in a launcher's words, a cloud launcher's preemption exception
    ("Normal   TaintManagerEviction  pod/trainer-worker-1  Marking for deletion Pod default/trainer-worker-1",
     "node_lost"),
    ("      Reason:       ContainerStatusUnknown", "node_lost"),
    ("autoscaler: Node i-0123abcd has failed", "node_lost"),
    ("Exception: Worker node 10.0.0.5 lost", "node_lost"),
    ("sky.exceptions.ManagedJobPreemptedError: the job's cluster was taken back", "node_lost"),
    # the board's own warnings, a GPU the kernel can no longer wake on the bus, an Xid named in words
    ("WARNING: infoROM is corrupted at gpu 0000:04:00.0", "gpu_hardware"),
    ("        Pending Page Blacklist      : Yes", "gpu_hardware"),
    ("[ 812.1] nvidia 0000:3b:00.0: can't change power state from D3cold to D0 (config space inaccessible)",
     "gpu_hardware"),
    ("dcgm: GPU 3: Detected Critical Xid Error", "gpu_hardware"),
    # a hang in a progress watcher's words, faulthandler's timer firing
    ("WARNING: Detected possible hang: no training progress in 600 seconds", "nccl_hang"),
    ("Timeout (0:30:00)!", "nccl_hang"),
    ("fault_tolerance: rank 3 is stuck at step 1200", "nccl_hang"),
    # the CUDA error's name, not its words: the job's kernel, the container's forward-compatibility package
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "user_error"),
    ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 804: forward compatibility was attempted "
     "on non supported HW", "user_error"),
    # a crash in words other than Python's (Rust, Go), a package that would not build, an exceptions module's class
    ("thread 'main' panicked at 'called `Result::unwrap()` on an `Err` value', src/main.rs:10:5", "user_error"),
    ("panic: runtime error: invalid memory address or nil pointer dereference", "user_error"),
    ("  error: subprocess-exited-with-error", "user_error"),
    ("ray.exceptions.RuntimeEnvSetupError: Failed to set up runtime environment.", "user_error"),
    ("torch._dynamo.exc.Unsupported: call_function BuiltinVariable(setattr)", "user_error"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb)`",
     "user_error"),
    # an NCCL WARN whose failure word is capitalised
    ("vm-133:52744:52787 [0] proxy.cc:1119 NCCL WARN [Proxy Service 4] Failed to execute operation Connect from rank "
     "4, retcode 2", "nccl_error"),
    # NCCL's topology search finding no network device between the nodes
    ("gpu-2:4242:4300 [0] graph/topo.h:230 NCCL WARN Could not find NET with id 0", "nccl_error"),
    # the transports under the collective libraries
    ("[mlx5_0:1/IB] Transport retry count exceeded on mlx5_0:1/IB (status 12)", "nccl_error"),
    ("NET/OFI Request 0x7f completed with error. RC: 5. Error: 5 (Input/output error). Completed length: 0",
     "nccl_error"),
    ("[1699999999.123] [node1:1234:0] ib_iface.c:746 UCX ERROR ibv_create_cq(cqe=4096) failed", "nccl_error"),
    # the container's path to the GPUs set up wrong (NVIDIA Container Toolkit, docker, runc, CDI)
    ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a newer "
     "version, or use an earlier cuda container: unknown.", "user_error"),
    ("nvidia-container-cli: device error: 3: unknown device: unknown.", "user_error"),
    ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].', "user_error"),
    ("docker: Error response from daemon: unknown or invalid runtime name: nvidia.", "user_error"),
    ("Error: failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
     'failed: unable to start container process: exec: "torchrun": executable file not found in $PATH: unknown',
     "user_error"),
    ("error modifying OCI spec: failed to inject CDI devices: unresolvable CDI devices nvidia.com/gpu=all: unknown.",
     "user_error"),
    ("E0312 10:00:00.000000       1 factory.go:99] Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND.", "user_error"),
    ("nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.", "gpu_hardware"),
    # XLA's runtime and TensorRT-LLM on a launch that does not fit them
    ("F1002 10:00:00.000000  1234 client.h:80] Terminating process because the JAX distributed service detected "
     "fatal errors. absl::Status: INVALID_ARGUMENT: Unexpected heartbeat request from task: "
     "/job:jax_worker/replica:0/task:8. This usually implies a configuration error.", "user_error"),
    ("[TensorRT-LLM][ERROR] Assertion failed: MPI size 4 != TP size 2 * PP size 1 * CP Size 1 "
     "(/app/tensorrt_llm/cpp/tensorrt_llm/runtime/worldConfig.cpp:109)", "user_error"),
    ("[TensorRT-LLM][ERROR] 6: The engine plan file is not compatible with this version of TensorRT, expecting library "
     "version 10.3.0.26 got 10.1.0.27, please rebuild.", "user_error"),
    ("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Getting local topologies failed: Error 1: GetKeyValue() timed "
     "out with key: cuda:local_topology/cuda/1 and duration: 2m", "nccl_hang"),
    ("RuntimeError: No executable batch size found, reached zero.", "gpu_oom"),
    ('RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp":838, please '
     "report a bug to PyTorch.", "gpu_oom"),
    ("torch._C._LinAlgError: linalg.cholesky: The factorization could not be completed because the input is not "
     "positive-definite (the leading minor of order 3 is not positive-definite).", "user_error"),
    ("TERM_CWD_NOTEXIST: Current working directory is not accessible or does not exist on the execution host.",
     "user_error"),
    ("RuntimeError: Adjust layout failed! No enough CUDA memory! Need 4194304, freed 1048576", "gpu_oom"),
    ("W0612 10:22:41.123456 48213 comm_task_manager.cc:145] Find timeout start but not finish task:group_key:group_0,"
     "global_rank:0,local_rank:0,comm_count:1234,op:ALLREDUCE,started:1,completed:0,numel:4194304,nranks:8",
     "nccl_hang"),
    ("colossalai - colossalai - ERROR: Provided path (/ckpt/model.pt) should be a directory, not a file", "user_error"),
    # serving engines' and llama.cpp's own memory words
    ("Server error: Not enough memory to handle 16384 prefill tokens. You need to decrease "
     "`--max-batch-prefill-tokens`", "gpu_oom"),
    ("Error: Backend(NotEnoughMemory(8192))", "gpu_oom"),
    ("RuntimeError: No enough gpu memory for kv cache.", "gpu_oom"),
    ("[TM][ERROR] No enough blocks. Assertion fail: /lmdeploy/src/turbomind/models/llama/LlamaBatch.cc:508", "gpu_oom"),
    ("ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 2147483648", "gpu_oom"),
    ("nvshmem_src/host/mem/mem_heap.cpp:2266: nvshmem malloc failed (hint: check if total allocation has exceeded "
     "NVSHMEM symmetric size = 1073741824)", "gpu_oom"),
    ("2024-06-01T10:00:00.000000Z ERROR text_generation_launcher: text-generation-server not found in PATH",
     "user_error"),
    ('E0108 10:00:00.000000 1 model_lifecycle.cc:654] "failed to load \'resnet\' version 1: Not found: unable to load '
     'shared library: libnvinfer.so.10: cannot open shared object file: No such file or directory"', "user_error"),
    ("llama_model_load: error loading model: error loading model vocabulary: unknown pre-tokenizer type: 'qwen35'",
     "user_error"),
    # MPICH, libfabric, NVSHMEM and DeepEP
    ("=   EXIT CODE: 9", "host_oom"),
    ("=   EXIT CODE: 11", "user_error"),
    ("[proxy:0:0@node01] HYDU_create_process (lib/utils/launch.c:73): execvp error on file ./train (No such file or "
     "directory)", "user_error"),
    ("MPIDI_CH3U_Recvq_FDU_or_AEP(629): Communication error with rank 3", "nccl_error"),
    ("MPIDI_OFI_handle_cq_error(1042): OFI poll failed (ofi_events.c:1042:MPIDI_OFI_handle_cq_error:Input/output "
     "error)", "nccl_error"),
    ("/nvshmem/src/host/init/init.cu:340: non-zero status: 7 bootstrap_init failed", "nccl_error"),
    ("DeepEP timeout for dispatch receivers, rank 3, responsible_channel = 7, tokens remained: 12", "nccl_hang"),
    ("RuntimeError: DeepEP error: timeout (dispatch CPU)", "nccl_hang"),
    ("LAUNCH INFO 2024-06-12 10:22:41,123 ABORT!!! Out of all 8 trainers, the trainer process with rank=[2, 3] was "
     "aborted. Please check its log.", "user_error"),
    # gloo's and MPI's own words
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:314] Write timeout [10.1.2.3]:26754", "nccl_hang"),
    ("RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/ibverbs/buffer.cc:144] Send timeout [10.1.2.3]",
     "nccl_hang"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:1046] Application timeout caused pair closure",
     "nccl_hang"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:201] Socket unexpectedly closed [10.1.2.3]:26754",
     "nccl_error"),
    ("RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/ibverbs/pair.cc:245] ibv_post_send: 12",
     "nccl_error"),
    ("RuntimeError: MPI_Allreduce failed, see MPI output for details.", "nccl_error"),
    ("[TensorRT-LLM][ERROR] Failed: MPI error /app/tensorrt_llm/cpp/tensorrt_llm/common/mpiUtils.cpp:150 '15'",
     "nccl_error"),
    # the launchers' own record of a rank that failed, and of the signal that ended it
    ("[2024-01-22 16:50:49,553] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
     "'--local_rank=7'] exits with return code = 1", "user_error"),
    ("[2024-01-22 16:50:49,553] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
     "'--local_rank=7'] exits with return code = -11", "user_error"),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 2019) of binary: "
     "/usr/bin/python", "user_error"),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 2019) of binary: "
     "/usr/bin/python", "user_error"),
    ("Status for job 'raysubmit_abc123': FAILED", "user_error"),
    # Ray Train counting its dead workers, Ray's object layer losing an object's every copy
    ("RuntimeError: Training has failed after 4 attempts.", "node_lost"),
    ("ray.exceptions.ObjectFetchTimedOutError: Failed to retrieve object 00ffffffffffffffffffffffff0100000001000000.",
     "node_lost"),
    ("ray.train.v2._internal.exceptions.WorkerHealthCheckTimeoutError: A worker health check has been hanging for "
     "600.12 seconds. Marking the worker as dead.", "node_lost"),
    ("Primary job  terminated normally, but 1 process returned a non-zero exit code. Per user-direction, the job has "
     "been aborted.", "user_error"),
    # Accelerator stacks other than CUDA: Ascend (torch_npu, CANN, HCCL), ROCm (ROCr, HIP, amdgpu), Gaudi (Synapse),
    # Intel (Level Zero, Unified Runtime), TPU (XLA's E0200).
    ("RuntimeError: NPU out of memory. NPUWorkspaceAllocator tried to allocate 2.00 GiB(NPU 3; 60.96 GiB total "
     "capacity; 1.02 GiB free).", "gpu_oom"),
    ("Resource_Error_Insufficient_Device_Memory(EI0011): Failed to allocate [1048576] bytes of NPU memory.", "gpu_oom"),
    ("RuntimeError: synStatus=synStatus 14 [Failed to allocate Device memory]. ", "gpu_oom"),
    ("Callback: Queue 0x7f2c40000000 Aborting with error : HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to "
     "allocate the necessary resources. Code: 0x1008 Available Free mem : 12 MB", "gpu_oom"),
    ("EE1013: Failed to allocate 4096 bytes of host memory via malloc to Runtime.", "host_oom"),
    ("synStatus 3 [Out of HOST memory (OOM)]. ", "host_oom"),
    ("zeMemAllocHost returned ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY", "host_oom"),
    ("[drm] VRAM is lost due to GPU reset!", "gpu_hardware"),
    ("amdgpu 0000:c1:00.0: [drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring kiq_0.2.1.0 test failed (-110)",
     "gpu_hardware"),
    ("RuntimeError: level_zero backend failed with error: 20 (UR_RESULT_ERROR_DEVICE_LOST)", "gpu_hardware"),
    ("Callback: Queue 0x7f2c40000000 aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent "
     "attempted to access memory beyond the largest legal address. code: 0x29", "user_error"),
    ("Memory access fault by GPU node-2 (Agent handle: 0x55d0c3b3a6f0) on address 0x7f1b2c000000. Reason: Write access "
     "to a read-only page.", "user_error"),
    ("zeModuleCreate returned ZE_RESULT_ERROR_MODULE_BUILD_FAILURE", "user_error"),
    ("EZ3003: No supported Ops kernel and engine are found for [FlashAttentionScore], optype [FlashAttentionScore].",
     "user_error"),
    ("Node 0 halted unexpectedly at tag:pc TensorCoreSequencer:23:0x292: BoundsCheck 92 [deref of %s931] for %937 = "
     "dma.hbm_to_vmem", "user_error"),
    ("Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is "
     "the OS OOM killer. Run 'dmesg -T | grep -i oom' to check.", "host_oom"),
    ("E1130 10:00:00.000000 1 health.go:126] Error waiting for event: ERROR_GPU_IS_LOST; Marking all devices as "
     "unhealthy", "gpu_hardware"),
    ("[ 12.345] NVRM: installed in this system is not supported by the", "user_error"),
    ("modprobe: ERROR: could not insert 'nvidia': Key was rejected by service", "user_error"),
    ("NVRM: The NVIDIA probe routine was not called for 1 device(s).", "user_error"),
    ("[TensorRT-LLM][ERROR] Assertion failed: Failed to deserialize cuda engine (/src/cpp/tensorrt_llm/runtime/"
     "tllmRuntime.cpp:150)", "user_error"),
    ("E0606 10:04:44.849920  7793 direct_task_transport.cc:240] Retrying attempt to schedule task at remote node. "
     "Error: IOError: 14: failed to connect to all addresses", "node_lost"),
    # lines found by probing real threads' logs for wordings the rules did not read
    ("libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, message: Invalid address My "
     "EFA addr: fi_addr_efa://[fe80::13:c2ff:fe6f:f03d]:0:1072483550", "nccl_error"),
    ("Unable to write to EQ: Missing or unavailable event queue. err: Input/output error (5) prov_errno: Unknown error "
     "-114 (-114) prov/rxr/src/rxr.h:1042", "nccl_error"),
    ("THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1595629403081/work/torch/csrc/cuda/Module.cpp line=59 "
     "error=101 : invalid device ordinal", "user_error"),
    ("[rank3]: Cuda failure 802 'system not yet initialized'", "gpu_hardware"),
    ("srun: error: Unable to create step for job 16413634: Invalid generic resource (gres) specification",
     "user_error"),
    ("srun: fatal: SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually exclusive.", "user_error"),
    ("nvidia-docker | 2016/08/22 12:54:02 Error: unsupported CUDA version: driver 7.5 < image 8.0", "user_error"),
    ("nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: cannot open shared object "
     "file: no such file or directory: unknown.", "user_error"),
    ('Error: OCI runtime create failed: container_linux.go:345: starting container process caused "exec: '
     '\\"storageos\\": executable file not found in $PATH": unknown', "user_error"),
    ('failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: '
     'error during container init: exec: "": executable file not found in $PATH', "user_error"),
    ("[TRT] [E] 1: [stdArchiveReader.cpp::StdArchiveReader::35] Error Code 1: Serialization (Serialization assertion "
     "safeVersionRead == safeSerializationVersion failed.Version tag does not match.", "user_error"),
    ("Failed to initialize process group: Error initializing torch.distributed using env:// rendezvous: environment "
     "variable RANK expected, but not set, falling back to single GPU", "user_error"),
    ("(pid=1521999)  But your machine only has: [0]", "user_error"),
    ("nvcc fatal   : Unsupported gpu architecture 'compute_86'", "user_error"),
    ("ninja: build stopped: subcommand failed.", "user_error"),
    ("  Value error, Total number of attention heads (64) must be divisible by tensor parallel size (3). "
     "[type=value_error, input_value=ArgsKwargs((), {'model_config': ...}), input_type=ArgsKwargs]", "user_error"),
    ("[2025-03-03 06:49:28 TP5] Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens). Use a "
     "shorter input or enable --allow-auto-truncate.", "user_error"),
    ("The decoder prompt (length 15329) is longer than the maximum model length of 8192. Make sure that "
     "`max_model_len` is no smaller than the number of text tokens", "user_error"),
    ("write error: wrote 2854962 blocks instead of 3211264 at /home/u/torch/pkg/torch/lib/TH/THDiskFile.c:331",
     "disk_full"),
    ("| densenet_onnx | 1 | UNAVAILABLE: Internal: unable to create stream: the provided PTX was compiled with an "
     "unsupported toolchain. |", "user_error"),
    ("E tensorflow/stream_executor/cuda/cuda_driver.cc:802] failed to alloc 34359738368 bytes on host: "
     "CUDA_ERROR_OUT_OF_MEMORY: out of memory", "host_oom"),
    ("W tensorflow/core/common_runtime/device/device_host_allocator.h:46] could not allocate pinned host memory of "
     "size: 34359738368", "host_oom"),
    ("[TensorRT] ERROR: Requested amount of memory (150994944 bytes) could not be allocated. There may not be enough "
     "free memory for allocation to succeed.", "gpu_oom"),
    ("[virtualMemoryBuffer.cpp::resizePhysical::144] Error Code 2: OutOfMemory (no further information)", "gpu_oom"),
    ("RuntimeError: FATAL ERROR :: MODULE:SYNHELPER workspace Allocation of size ::14493510400 failed!", "gpu_oom"),
    ("Compilation failure: Aborting compilation early because it's unlikely to have enough memory. Requires 3.47E, has "
     "14.49G available.", "gpu_oom"),
    ("[   72.993269] habanalabs 0000:1a:00.0: Failed to initialize hl2. Device is NOT usable !", "gpu_hardware"),
    ("2022-Mar-29 07:07:29.0082    11:11    ERROR   NRT:nrt_init    Unable to determine Neuron Driver version. Please "
     "check aws-neuron-dkms package is installed.", "user_error"),
    ("ERROR   ENC:validate_neff_cc_ops    [nec_dev 0] mismatching number of cc ops, expected 6 received 3. Check if "
     "ranks 1 and 0 are using the same neff", "user_error"),
    ("Error while writing to file C:\\Users\\u\\AppData\\Local\\vibe\\ggml-medium.bin: Espace insuffisant sur le "
     "disque. (os error 112)", "disk_full"),
    ("Failed to modify QP to RTR: Connection timed out", "nccl_error"),
    ("PytorchStreamReader failed reading zip archive: failed finding central directory", "user_error"),
    ('Unexpected key(s) in state_dict: "world_classifier.0.weight", "world_classifier.0.bias".', "user_error"),
    ("WeightsUnpickler error: Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default.",
     "user_error"),
    ("ArrowInvalid: JSON parse error: Column(/metadata/o_wiki_title) changed from string to number in row 1232",
     "user_error"),
    ("HDF5-DIAG: Error detected in HDF5 (1.8.16) thread 140603273537280:", "user_error"),
    ("Cannot access gated repo for url https://huggingface.co/google/gemma-2-2b-it/resolve/main/.gitattributes.",
     "user_error"),
    ("torch.distributed._shard.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1, 2, 3])",
     "user_error"),
    ("!!! Exception during processing !!! The actor died because of an error raised in its creation task, "
     "ray::RayCOMMTester.__init__() (pid=26476, ip=127.0.0.1)", "user_error"),
    ("ERROR exceptions.py:63 -- Exception occurred in user code, with the abbreviated stack trace below.",
     "user_error"),
    ("job 3132467 exceeded MEM usage hard limit (2528 > 1126)", "host_oom"),
    ("1050981.0   dbrown  11/7  23:48 Job in status 2 put on hold by SYSTEM_PERIODIC_HOLD due to memory usage 3000000.",
     "host_oom"),
    ("EC2 is terminated unintendedly for job hSpIncnfdaf1 - please rerun.: EC2UnintendedTerminationException",
     "node_lost"),
    ("WARNING:  allocated node           cu25-0 is in state Down", "node_lost"),
    ("      message: Job has reached the specified backoff limit", "user_error"),
    ("Couldn't init CUDA: Error (gpu_burn-drv.cpp:304): system not yet initialized", "gpu_hardware"),
    ("[error] Unexpected error from cudaGetDeviceCount(). Error 805: MPS client failed to connect to the MPS control "
     "daemon or the MPS server", "user_error"),
    ("The replica workerpool1-1 exited with a non-zero status of 1. Termination reason: Error.", "user_error"),
    ("The replica workerpool0-0 exited with a non-zero status of 137. Termination reason: Error.", "host_oom"),
    ("E external/org_tensorflow/tensorflow/compiler/xla/service/collective_ops_utils.h:209] This thread has been "
     "waiting for 5000ms for and may be stuck: participant for device ordinal 1, stream 0x5594682cb160", "nccl_hang"),
]


@pytest.mark.parametrize(("line", "category"), SHAPES)
def test_a_failure_in_words_no_signature_knows_gets_its_category_at_a_low_confidence(line: str, category: str) -> None:
    result = verdict("step 10 loss=1.2", line)
    assert result["category"] == category, result
    assert 0 < result["confidence"] <= GENERIC_CAP
    assert "generic rule" in result["summary"]


# Healthy lines with alarming words: no generic rule may read them as a failure.
HEALTHY = [
    "NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v6 symbol, falling back to internal implementation",
    "[W socket.cpp:601] [c10d] The client socket has failed to connect to [node-7]:29500 (errno: 22 - Invalid "
    "argument).",
    "trainer.timeout=1800 nccl_timeout=600 save_freq=100",
    "|  N/A   34C  P0   62W / 400W |  ECC errors: 0  | Volatile Uncorr. ECC: 0 |",
    "we handle a KeyError here by retrying",
    "epoch 3 eval_error_rate=0.02 val_loss=1.1",
    "node_rank=1 nnodes=2 master_addr=10.0.0.1",
    "Autoscaler: removing 2 idle nodes (idle for 600 s)",
    "(autoscaler +9m) Instance k-1a5e (node IP: 10.1.140.199) will be terminated soon (reason: idle for 60 s).",
    "UserWarning: torch.cuda.amp.GradScaler is deprecated",
    "INFO checkpoint saved to /ckpt/global_step_100 (12.3 GiB), 2.1 TiB free",
    "Killed 0 workers",
    "asyncio.exceptions.CancelledError: ",
    "host-1:14926:14926 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
    "   JobState=RUNNING Reason=None FailedNode=(null) Dependency=(null)",
    "    Remapping Failure Occurred        : No",
    "INFO max_num_seqs reduced so the KV cache fits: 12.5 GiB free",
    # advice that guesses (vLLM prints it for every slow step: a model loading, a kernel compiling)
    "No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are "
    "hanging or doing some time-consuming work (e.g. compilation).",
    # an exception's traceback through a collective (a comma before "in") is read by its exception, not as a dump
    '  File "/opt/torch/distributed/distributed_c10d.py", line 2050, in all_reduce',
    # the driver loading, and nvidia-smi's healthy table
    "[    4.123456] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023",
    "|   0  NVIDIA H100 80GB HBM3          On  | 00000000:18:00.0 Off |                    0 |",
    # a graceful stop marked dead is no loss
    "Node is marked as dead by GCS as it's already shutting down.",
    # the GCS's and core workers' housekeeping on any node's removal (an idle scale-down, a clean ray stop)
    "(gcs_server) gcs_job_manager.cc:300: Node is dead, marking all jobs with drivers on this node as finished.",
    "(gcs_server) gcs_placement_group_manager.cc:300: Node is dead, rescheduling the placement groups on the dead "
    "node.",
    "(gcs_server) gcs_actor_manager.cc:300: Node is dead, reconstructing actors.",
    "core_worker.cc:300: Node failure. All objects pinned on that node will be lost if object reconstruction is not "
    "enabled.",
    # Ray's tag names the process a line came from; a worker's pipe to its own object store is no collective
    "(raylet) 0 Workers (tasks / actors) killed due to memory pressure (OOM), 3 Workers crashed due to other reasons",
    "core_worker.cc:300: The connection to the plasma store is failed. Terminate the process. Status: IOError: Broken "
    "pipe",
    # torchrun's teardown and exit, and PyTorch's start-up and exit notes, in healthy and failed runs alike
    "torch.distributed.elastic.multiprocessing.api: [WARNING] Unable to shutdown process 36072 via Signals.SIGTERM, "
    "forcefully exiting via Signals.SIGKILL",
    "api.py:930] Process 36072 did not exit after SIGKILL within 30s; abandoning and continuing teardown.",
    "WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node 'node-2_36000_0' has failed to shutdown "
    "the rendezvous 'job42' due to an error of type RendezvousConnectionError.",
    "[rank0]:[W1105 13:37:10.134661876 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank 0]  using GPU 0 to perform "
    "barrier as devices used by this process are currently unknown. This can potentially cause a hang if this rank to "
    "GPU mapping is incorrect. Specify device_ids in barrier() to force use of a particular device.",
    "[rank1]:[E1003 18:38:16.8 ProcessGroupNCCL.cpp:1301] [PG ID 0 PG GUID 0(default_pg) Rank 1] Future for Flight "
    "recorder dump in heartbeatMonitor timed out after 15000 ms",
    "[rank3]:[W501 10:00:00.1 ProcessGroupNCCL.cpp:1400] [PG ID 0 PG GUID 0 Rank 3] Failed to check the "
    "\"should dump\" flag on TCPStore, (maybe TCPStore server has shut down too early), with error: "
    "Connection reset by peer",
    "[rank0]:[I501 10:00:00.1 ProcessGroupNCCL.cpp:900] [PG ID 0 PG GUID 0 Rank 0] Launching ProcessGroupNCCL abort "
    "asynchronously.",
    # NCCL's INFO lines for calls it retries (misc/ibvwrap.cc, os/linux.cc)
    "host:48213:48213 [0] NCCL INFO Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr "
    "state INIT, next state RTR, retrying 1/5 after 100 msec of sleep",
    "host:48213:48213 [0] NCCL INFO mkstemp: Failed to create /dev/shm/nccl-a1B2c3, error: Interrupted "
    "system call (4) - retrying",
    # the frameworks' advice and request scheduling
    "INFO model_runner.py:1028] CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running out of "
    "memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode.",
    "WARNING scheduler.py:1057 Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode because there is not "
    "enough KV cache space.",
    # suspend and resume, and a counter at zero
    "[ 1234.5678] OOM killer enabled.",
    # XLA's autotuner falls back to a default algorithm when a faster one's workspace does not fit
    "W external/xla/xla/service/gpu/conv_algorithm_picker.cc:800] Failed to determine best cudnn convolution "
    "algorithm: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.",
    "oom_kill 0",
    "INFO node 3 marked healthy",
    # a node that could not start is a launch failure, not a loss; a host's memory is not the host
    "autoscaler: Node i-0123abcd has failed to start; retrying in 30 s",
    "host memory lost to fragmentation: 2.1 GiB",
    # NCCL says so when an InfiniBand event is not fatal
    "gpu-1:1234:1260 [0] transport/net_ib.cc:170 NCCL WARN NET/IB : mlx5_0:1 Got non-fatal async event: GID table "
    "change(18)",
    # nvidia-smi -q on a healthy board
    "        Pending Page Blacklist      : No",
    # Argus's own stall finding, classified as what it is (TrainingStalled), not read again as a log line
    "no progress for 21 s; step interval estimate 5.00 s from 12 progress events; stall threshold 20 s",
    "Job grpo-1 is RUNNING but made no progress for 21 s",
    # a progress watcher's own settings and advice
    "hang_detection_timeout=600 stall_check_interval=30",
    "If the job is stuck, run py-spy dump on each rank",
    # "=" in a printed setting
    "DCGM_HEALTH_WATCH_XID=0 xid_skip=79",
    # TensorFlow's allocator saying its own warning is no failure (a faster algorithm's workspace did not fit)
    "W tensorflow/core/common_runtime/bfc_allocator.cc:237] Allocator (GPU_0_bfc) ran out of memory trying to allocate "
    "2.39GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be "
    "performance gains if more memory were available.",
    # a connect gloo will try again; TensorRT's builder skipping a tactic; XLA looking for a preemption notice
    "[../third_party/gloo/gloo/transport/tcp/debug_logger.cc:9] ERROR failed to connect, willRetry=1, retry=1, "
    "retryLimit=3, rank=1, size=4, local=[10.1.2.4]:40112, remote=[10.1.2.3]:26754, error=SO_ERROR: Connection refused",
    "[TRT] [W] Tactic Device request: 4096MB Available: 2048MB. Device memory is insufficient to use tactic.",
    "I1002 10:00:00.000000  1234 preemption_sync_manager.cc:140] Cancelled call to retrieve preemption notice. This is "
    "expected upon program shutdown.",
    "W1002 10:00:00.000000  1234 preemption_sync_manager.cc:150] Failed to retrieve preemption notice, this is only "
    "expected if one of the tasks is unhealthy. Check the logs for the actual root cause.",
    # the kubelet's reasons, and the scheduler's report on the cluster's other nodes
    'E0312 10:00:00.000000    1234 pod_workers.go:1298] "Error syncing pod, skipping" err="failed to '
    '\\"CreatePodSandbox\\" for \\"trainer-0_default(abc)\\" with CreatePodSandboxError: \\"rpc error: code = '
    'DeadlineExceeded desc = context deadline exceeded\\""',
    "Warning  FailedScheduling  2m  default-scheduler  0/4 nodes are available: 1 node(s) had untolerated taint "
    "{node.kubernetes.io/unreachable: }, 3 Insufficient nvidia.com/gpu.",
    # Composer's auto-microbatching caught the OOM and runs on; its launcher's teardown kill is its own
    "/usr/lib/python3/site-packages/composer/trainer/trainer.py:366: RuntimeWarning: CUDA out of memory or excessive "
    "memory allocation retries detected. Train microbatch size will be decreased from 16 -> 8.",
    "WARNING:composer.cli.launcher:Failed to kill global rank 5 (PID 48215) with SIGTERM; terminating with SIGKILL "
    "instead",
    # llama.cpp falling back from pinned or locked memory, UCX's fork warning, TensorFlow's optional libraries
    "WARNING: failed to allocate 512.00 MB of pinned memory: out of memory",
    "warning: failed to mlock 1073741824-byte buffer (after previously locking 0 bytes): Cannot allocate memory",
    "[1699999999.123456] [node01:12345:0]          ib_md.c:927  UCX  WARN  IB: ibv_fork_init() was disabled or "
    "failed, yet a fork() has been issued.",
    "W tensorflow/stream_executor/platform/default/dso_loader.cc:64] Could not load dynamic library "
    "'libcudart.so.11.0'; dlerror: libcudart.so.11.0: cannot open shared object file: No such file or directory",
    # the kernel about poisoned RAM, a CPU stall and a NIC queue it reset; mlx5's refused probe command
    "[ 1234.5678] Memory failure: 0x3b4e2c: Sending SIGBUS to python:48213 due to hardware memory corruption",
    "[ 1234.5678] rcu: INFO: rcu_sched self-detected stall on CPU",
    "[ 1234.5678] NETDEV WATCHDOG: enp181s0np0 (mlx5_core): transmit queue 3 timed out 5120 ms",
    "[ 1234.5678] mlx5_core 0000:d2:00.0: mlx5_cmd_out_err:838:(pid 1441871): ACCESS_REG(0x805) op_mod(0x1) failed, "
    "status bad operation(0x2), syndrome (0x305684), err(-22)",
    # huggingface_hub's check before a download only warns (and is wrong on some network filesystems)
    "/usr/lib/python3/site-packages/huggingface_hub/file_download.py:752: UserWarning: Not enough free disk space to "
    "download the file. The expected file size is: 0.05 MB. The target location /data/model-files only has 0.00 MB "
    "free disk space.",
    # a request waiting for a place (unschedulable is read from Ray's state), not a failed launch
    "(autoscaler +10s) Error: No available node types can fulfill resource request {'GPU': 8.0, 'CPU': 1.0}. Add "
    "suitable node types to this cluster to resolve this issue.",
]


@pytest.mark.parametrize("line", HEALTHY)
def test_healthy_lines_with_alarming_words_are_no_failure(line: str) -> None:
    assert [r.reason for r in RULES.match(line) if r.generic and r.permanent] == []


# Lines a signature reads, which the generic tier must also read on its own: the same failure in another wording
# reaches only the generic tier.
ALSO_GENERIC = [
    ("The node with client ID 1eadc9db2f07 has been marked dead because the monitor has missed too many heartbeats "
     "from it.", "node_lost"),
    ("[2022-02-16 12:46:52,789 C 149 149] node_manager.cc:170: This node has been marked as dead.", "node_lost"),
    ("W tensorflow/core/framework/op_kernel.cc:968] Resource exhausted: OOM when allocating tensor with "
     "shape[256,832,7,7]", "gpu_oom"),
    ("(1) Resource exhausted: Attempting to allocate 180.59M. That was not possible. There are 142.58M free.",
     "gpu_oom"),
    ("[trainer0|0]:ncclInternalError: Internal check failed.", "nccl_error"),
    ("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
     "nccl_error"),
]


@pytest.mark.parametrize(("line", "category"), ALSO_GENERIC)
def test_the_generic_tier_alone_reads_what_a_signature_reads(line: str, category: str) -> None:
    assert {r.category.value for r in RULES.match(line) if r.generic and r.permanent} == {category}


@pytest.mark.parametrize(("line", "not_this"), [
    ("Exception: Server process terminated unexpectedly.", "GenericNodeGone"),  # a process, not a machine
    # SGLang's advice is printed with every exit code; only its -9 is a SIGKILL
    ("Rank 0 scheduler died during initialization (exit code: 1). If exit code is -9 (SIGKILL), a common cause is the "
     "OS OOM killer. Run 'dmesg -T | grep -i oom' to check.", "GenericProcessSigkilled"),
    ("Rank 0 scheduler died during initialization (exit code: 1). If exit code is -9 (SIGKILL), a common cause is the "
     "OS OOM killer. Run 'dmesg -T | grep -i oom' to check.", "GenericHostOutOfMemory"),
    # DCGM's client without its daemon, and the GPU operator's probe of its driver pod, are no lost node
    ("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.", "GenericNodeGone"),
    ("NVIDIA driver daemons are not ready; Current status: NotReady", "GenericNodeGone"),
    ("[DecoupledCheckpointEngine] Checkpoint process died unexpectedly. Check logs for OOM or other errors in the "
     "checkpoint subprocess.", "GenericProcessDiedUnexpectedly"),
    # ROCm's GPU page fault on an unmapped address: threads trace it to the driver or the card as often as to the job
    ("Memory access fault by GPU node-2 (Agent handle: 0x55d0c3b3a6f0) on address 0x7f1b2c000000. Reason: Page not "
     "present or supervisor privilege.", "GenericCudaUsageError"),
    # Xid 43 is the application's (a kernel it ran faulted), in the device plugin's words too
    ("2020/08/10 19:09:42 XidCriticalError: Xid=43 on Device=GPU-7540a9b3, the device will go unhealthy.",
     "GenericGpuFault"),
    ("[E ProcessGroupNCCL.cpp:455] Some NCCL operations have failed or timed out.", "GenericCollectiveTimeout"),
    # an actor's own exception in its creation task is not a process that vanished
    ("ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
     "ray::Trainer.__init__() (pid=4242, ip=10.0.0.5) ValueError: unknown optimizer 'adamw8'",
     "GenericProcessDiedUnexpectedly"),
    # libfabric's informational lines, nvcc's warnings, a value error in prose: no failure of theirs
    ("libfabric:123:1700000000::efa:core:efa_device_init():300<info> efa device found", "GenericCommunicationFailure"),
    ("nvcc warning : The 'compute_35' architecture is deprecated, and may be removed in a future release.",
     "GenericLaunchMistake"),
    ("step 300: the value error, if any, is logged below", "GenericLaunchMistake"),
    # a watchdog line a terminal wrapped right after "[Rank 0": the exception is on the next line
    ("[rank0]:[E ProcessGroupNCCL.cpp:1182] [Rank 0] NCCL watchdog thread terminated with exception: [Rank 0",
     "ProcessGroupWatchdogException"),
    # DCGM's clock events: a GPU slowed by its power or thermal limit, not a faulty one
    ("GpuPowerWatchIsNotHealthy Message=ErrorCode:DCGM_FR_CLOCK_THROTTLE_POWER GPU:0 PCI:0000:0f:00.0 Detected clocks "
     "event due to power violation in GPU 0.", "GenericGpuFault"),
    ("DCGM_FR_CLOCKS_EVENT_THERMAL: Detected clocks event due to thermal violation in GPU 1.", "GenericGpuFault"),
    # the store's debug line for a client that closed its socket, printed at every shutdown
    ("[I323 21:57:08.462050602 TCPStoreLibUvBackend.cpp:120] [c10d - debug] Read callback failed. code:-4095 name:EOF "
     "desc:end of file", "GenericCommunicationFailure"),
    # JAX's coordination service lists what a lost heartbeat may mean; a preemption is one guess, not what it saw
    ("E coordination_service.cc:956] /job:jax_worker/replica:0/task:15 has been set to ERROR in coordination service: "
     "UNAVAILABLE: Task /job:jax_worker/replica:0/task:15 heartbeat timeout. This indicates that the remote task has "
     "failed, got preempted, or crashed unexpectedly.", "GenericPreemption"),
    # Ray's wrapper naming no exception class is a header: the lines after it say what failed
    ("ray.exceptions.RayTaskError: ray::reduce() (pid=240, ip=172.31.86.123)", "GenericPythonException"),
    ("ray.exceptions.RayTaskError: ray::reduce() (pid=240, ip=172.31.86.123)", "GenericJobFailed"),
])
def test_a_word_that_names_something_else_is_not_read_as_it(line: str, not_this: str) -> None:
    assert not_this not in [r.reason for r in RULES.match(line)]


@pytest.mark.parametrize("line", [
    "[ 5121.33] Out of memory: Killed process 4242 (python) total-vm:81234kB",
    "RuntimeError: failed to map segment from shared object: Cannot allocate memory",
    "ERROR host out of memory while loading the dataset",
])
def test_a_bare_out_of_memory_error_is_not_read_as_the_gpus_where_the_line_names_the_host(line: str) -> None:
    assert "GenericOutOfMemoryError" not in [r.reason for r in RULES.match(line)]


def test_a_connection_reset_in_rays_control_plane_is_a_node_not_the_jobs_communication() -> None:
    # The same words in a rank's own socket stay a communication failure.
    assert verdict("[E socket.cpp:860] [c10d] recv failed: Connection reset by peer")["category"] == "nccl_error"
    ray_rpc = "(raylet) node_manager.cc:1 RpcError: RPC Error message: Connection reset by peer"
    assert "GenericPeerConnectionLost" not in [r.reason for r in RULES.match(ray_rpc)]


def test_a_signature_anywhere_in_the_log_decides_over_every_generic_reading() -> None:
    # The generic node-gone line comes first, yet the CUDA OOM signature decides.
    result = verdict("worker node 10.0.0.2 disconnected", "torch.OutOfMemoryError: CUDA out of memory. Tried to "
                     "allocate 2.00 GiB", "ValueError: boom")
    assert result["category"] == "gpu_oom" and result["confidence"] > GENERIC_CAP
    assert "generic" not in result["summary"]


def test_a_generic_rule_never_contradicts_a_signature_on_the_same_line() -> None:
    # "File ... cannot be opened" is a full disk's warning signature before it is a RuntimeError's shape.
    result = verdict("RuntimeError: File ckpt/checkpoint_0.pt cannot be opened.")
    assert result["category"] == "disk_full"
    # Where they agree (a SIGKILL warning and the generic host OOM), the generic reading stands and decides over
    # the launcher's "ChildFailedError" printed first.
    result = verdict("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
                     "rank2 (local rank: 2)exitcode: -9 (pid: 36071)")
    assert result["category"] == "host_oom"


def test_an_eviction_is_read_by_its_reason_where_the_log_gives_one() -> None:
    evicted = "train-master-0     0/1       Evicted   0          19h"
    assert verdict(evicted)["category"] == "node_lost"
    assert verdict(evicted, "Reason:         Evicted", "Message:        The node was low on resource: memory.")[
        "category"] == "host_oom"
    assert verdict(evicted, "Message: The node was low on resource: ephemeral-storage.")["category"] == "disk_full"


def test_among_generic_readings_a_cause_beats_an_echo_and_then_the_first_in_time_wins() -> None:
    lines = ["RuntimeError: NCCL communicator was aborted on rank 1",  # an echo (nccl_error)
             "raylet on host 10.0.0.9 crashed", "MemoryError: "]  # two causes: the first in time wins
    matches = list(RULES.scan(lines, source="x"))
    winner = root_cause(matches)
    assert winner is not None and winner.rule.category is Category.NODE_LOST and winner.rule.generic
    assert tier(classify(matches)) == TIER_GENERIC < TIER_ROOT_CAUSE


def test_live_detection_reads_running_jobs_with_the_signatures_only(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, shared_root=tmp_path / "no-such-root")
    [live] = [d for d in build_detectors(settings, MetricRuleSet()) if isinstance(d, LogRuleDetector)]
    assert live.rules.rules and not any(r.generic for r in live.rules)
    assert any(r.generic for r in RULES) and len(RULES.signatures()) < len(RULES)


def test_a_rule_files_tier_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    body = """\
        source: '*'
        rules:
          - reason: MyShape
            category: node_lost
            tier: {tier}
            type: permanent
            pattern: 'machine \\w+ vanished'
    """
    path.write_text(textwrap.dedent(body.format(tier="generic")))
    [rule] = RuleSet.load([path]).rules
    assert rule.tier is RuleTier.GENERIC and rule.generic
    path.write_text(textwrap.dedent(body.format(tier="vague")))
    with pytest.raises(RuleError, match="unknown tier 'vague'") as info:
        RuleSet.load([path])
    assert "signature, generic" in str(info.value.hint)


def test_a_traceback_without_its_exception_line_is_read_only_where_nothing_else_is() -> None:
    cut = verdict("step 10 loss=1.2", "Traceback (most recent call last):", '  File "train.py", line 9, in <module>')
    assert cut["category"] == "user_error", cut
    # any other reading, even a warning's, explains more than the traceback's first line
    saved = verdict("Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
                    "RuntimeError: File ckpt/checkpoint_0.pt cannot be opened.")
    assert saved["category"] == "disk_full", saved


@pytest.mark.parametrize("header", [
    # vLLM's logger.exception puts its head before every line of the traceback; SkyPilot's logger the same with one
    # letter for the level; older vLLM without the brackets
    "ERROR 03-05 00:25:45 [core.py:1094] Traceback (most recent call last):",
    "(LLMRayActor pid=58) (EngineCore_DP0 pid=61) ERROR 03-05 00:25:45 [core.py:1094] "
    "Traceback (most recent call last):",
    "ERROR 06-12 19:01:08 worker_base.py:145] Traceback (most recent call last):",
    "E 11-28 14:41:59 controller.py:163] Traceback (most recent call last):",
    # a progress bar the crash cut mid-update, kept on the header's line
    "Running tokenizer on dataset:  38%|###8      | 32068/85249 [32:13<53:59, 16.42ba/s]"
    "Traceback (most recent call last):",
    " 10%|#         | 10/100 [00:15<02:15,  1.50s/it]Traceback (most recent call last):",
    # a banner that logs the traceback after its own words
    "[2025-04-21 04:13:43 TP0] Scheduler hit an exception: Traceback (most recent call last):",
])
def test_a_traceback_header_behind_a_loggers_head_or_a_progress_bar_is_read(header: str) -> None:
    assert verdict("step 10 loss=1.2", header)["category"] == "user_error"


@pytest.mark.parametrize("line", [
    'print("Traceback (most recent call last):")',  # the words quoted in code, not a traceback's header
    "INFO 03-05 00:25:45 [core.py:1094] printing Traceback (most recent call last): for a test",
])
def test_a_traceback_header_quoted_inside_other_words_is_not_read(line: str) -> None:
    assert verdict("step 10 loss=1.2", line)["category"] == "unknown"


def test_an_import_a_destructor_tries_at_exit_is_no_failure() -> None:
    # the run is over when Python prints it, whatever ended the run
    at_exit = verdict("Exception ignored in: <function Vllm.__del__ at 0x7f1723e82d30>",
                      "ImportError: sys.meta_path is None, Python is likely shutting down")
    assert at_exit["category"] == "unknown", at_exit
    assert verdict("ImportError: cannot import name 'LlamaConfig' from 'transformers'")["category"] == "user_error"


def test_a_watchdog_line_wrapped_before_its_exception_is_read_by_the_next_line() -> None:
    wrapped = verdict("[rank0]:[E ProcessGroupNCCL.cpp:1182] [Rank 0] NCCL watchdog thread terminated with exception: "
                      "[Rank 0", "] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLGATHER, "
                      "NumelIn=1, NumelOut=2, Timeout(ms)=1800000) ran for 1800012 milliseconds before timing out.")
    assert wrapped["category"] == "nccl_hang", wrapped


def test_rays_bare_task_wrapper_gives_way_to_the_error_it_wraps() -> None:
    header = "ray.exceptions.RayTaskError: ray::reduce() (pid=240, ip=172.31.86.123)"
    lost = verdict(header, "  At least one of the input arguments for this task could not be computed:",
                   "ray.exceptions.ObjectFetchTimedOutError: Failed to retrieve object 92ba3d58fa71ff60ffffffffffffffff"
                   "ffffffff030000002a020000. To see information about where this ObjectRef was created in Python")
    assert lost["category"] == "node_lost", lost
    # alone, it is a traceback cut before its exception
    assert verdict("step 10 loss=1.2", header)["category"] == "user_error"


def test_an_exception_raised_for_another_ranks_error_is_no_hang() -> None:
    # Lightning raises it from the handler of that rank's own exception: the traceback after it is the cause
    line = "lightning.pytorch.utilities.exceptions.DeadlockDetectedException: DeadLock detected from rank: 1"
    assert [r.reason for r in RULES.match(line) if r.category.value == "nccl_hang"] == []

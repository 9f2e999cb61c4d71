// HvdlikeWait: a TensorFlow op that waits for hvdlike requests without holding a thread.
//
// In a graph, each hvdlike collective is a submit op (a tf.numpy_function that hands the
// request to the engine and returns its key) and a wait op that returns the outputs. A
// numpy_function wait op blocks one of TensorFlow's inter-op threads until the other ranks
// have submitted too; a tf.compat.v1 session run of more independent collectives than
// threads could then stall, each rank's threads all waiting for requests whose submit ops
// the other ranks had no thread left to run. This kernel is asynchronous (as Horovod's ops
// are): ComputeAsync tells Python which keys it waits for and returns at once; Python
// (hvdlike/tensorflow/wait_kernel.py) later fills the outputs and finishes it from its own
// thread. A step cancelled while it waits (a session.run timeout, a closed session) finishes
// the op at once with its status. Built on first use against the installed TensorFlow.
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

// Python's callback: (waiter id, keys, number of keys, output dtypes, number of outputs).
typedef void (*NotifyFn)(int64_t, const int64_t*, int, const int*, int);

struct Waiter {
  OpKernelContext* context;
  AsyncOpKernel::DoneCallback done;
  tensorflow::CancellationManager* cancellation;  // the step's, or nullptr
  tensorflow::CancellationToken token;
};

std::mutex mu;  // guards the fields below
std::unordered_map<int64_t, Waiter> waiters;
int64_t next_waiter = 0;
NotifyFn notify = nullptr;
// Held while an output is written: a cancellation waits for it before finishing the op.
std::mutex output_mu;

// Remove waiter `id` into `out`; false when it is gone (finished or cancelled already).
bool take_waiter(int64_t id, Waiter* out) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = waiters.find(id);
  if (it == waiters.end()) return false;
  *out = std::move(it->second);
  waiters.erase(it);
  return true;
}

// The step's cancellation callback: finish waiter `id` with the status `Cancelled`. Its
// requests stay with the engine; their results are dropped when they complete.
void cancel(int64_t id) {
  Waiter waiter;
  {
    std::lock_guard<std::mutex> writing(output_mu);
    if (!take_waiter(id, &waiter)) return;
  }
  waiter.context->SetStatus(absl::CancelledError(
      "hvdlike: the step was cancelled (a session.run timeout or a closed session) while "
      "this collective waited for other ranks"));
  waiter.done();
}

OpKernelContext* context_of(int64_t id) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = waiters.find(id);
  return it == waiters.end() ? nullptr : it->second.context;
}

class HvdlikeWaitOp : public AsyncOpKernel {
 public:
  explicit HvdlikeWaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* context, DoneCallback done) override {
    std::vector<int64_t> keys(context->num_inputs());
    for (int i = 0; i < context->num_inputs(); ++i) {
      keys[i] = context->input(i).scalar<int64_t>()();
    }
    std::vector<int> dtypes(context->num_outputs());
    for (int i = 0; i < context->num_outputs(); ++i) {
      dtypes[i] = static_cast<int>(context->expected_output_dtype(i));
    }
    tensorflow::CancellationManager* cancellation = context->cancellation_manager();
    tensorflow::CancellationToken token =
        cancellation != nullptr ? cancellation->get_cancellation_token() : 0;
    NotifyFn fn;
    int64_t id;
    {
      std::lock_guard<std::mutex> lock(mu);
      fn = notify;
      id = next_waiter++;
      if (fn != nullptr) {
        waiters.emplace(id, Waiter{context, std::move(done), cancellation, token});
      }
    }
    OP_REQUIRES_ASYNC(context, fn != nullptr,
                      absl::FailedPreconditionError(
                          "hvdlike's wait kernel was loaded without hvdlike's Python side; "
                          "build graphs through hvdlike.tensorflow"),
                      done);
    if (cancellation != nullptr &&
        !cancellation->RegisterCallback(token, [id]() { cancel(id); })) {
      cancel(id);  // the step was cancelled before this op started
      return;
    }
    // Python may complete this waiter before returning (the requests were already done).
    fn(id, keys.data(), static_cast<int>(keys.size()), dtypes.data(),
       static_cast<int>(dtypes.size()));
  }
};

}  // namespace

REGISTER_OP("HvdlikeWait")
    .Input("keys: N * int64")
    .Output("outputs: Tout")
    .Attr("N: int >= 1")
    .Attr("Tout: list(type) >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->UnknownShape());
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HvdlikeWait").Device(tensorflow::DEVICE_CPU), HvdlikeWaitOp);

extern "C" {

void hvdlike_wait_set_notify(NotifyFn fn) {
  std::lock_guard<std::mutex> lock(mu);
  notify = fn;
}

// Output `index` of waiter `id`: shape `dims` (`ndim` of them), `nbytes` bytes copied from
// `data`. 0 on success; 1 when no such waiter; 2 when TensorFlow could not allocate the
// output; 3 when `nbytes` is not the output's size.
int hvdlike_wait_output(int64_t id, int index, int ndim, const int64_t* dims, const void* data,
                        int64_t nbytes) {
  std::lock_guard<std::mutex> writing(output_mu);
  OpKernelContext* context = context_of(id);
  if (context == nullptr) return 1;
  tensorflow::TensorShape shape;
  for (int i = 0; i < ndim; ++i) {
    if (!shape.AddDimWithStatus(dims[i]).ok()) return 2;
  }
  tensorflow::Tensor* out = nullptr;
  if (!context->allocate_output(index, shape, &out).ok()) return 2;
  if (static_cast<int64_t>(out->TotalBytes()) != nbytes) return 3;
  if (nbytes > 0) std::memcpy(out->data(), data, nbytes);
  return 0;
}

// Finish waiter `id`: with its outputs set (code 0), or failed with a TensorFlow status code
// and message. 0 on success, 1 when no such waiter.
int hvdlike_wait_finish(int64_t id, int code, const char* message) {
  Waiter waiter;
  if (!take_waiter(id, &waiter)) return 1;
  if (waiter.cancellation != nullptr) {
    // waits for a cancellation callback that runs now (it finds no waiter and returns)
    waiter.cancellation->DeregisterCallback(waiter.token);
  }
  if (code != 0) {
    waiter.context->SetStatus(absl::Status(static_cast<absl::StatusCode>(code), message));
  }
  waiter.done();
  return 0;
}

}  // extern "C"

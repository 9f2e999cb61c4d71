"""The shapes of Keras ResNet-50's trainable tensors, the gradient set the benchmarks reduce,
without importing TensorFlow (or anything but the standard library)."""
from typing import List, Tuple

Shape = Tuple[int, ...]


def resnet50_shapes() -> List[Shape]:
    """Shapes of keras.applications.ResNet50(weights=None).trainable_variables, in layer order.

    Keras ResNet v1 convs all have biases; BN contributes gamma and beta (its moving mean and
    variance are not trainable). Checked once against TF 2.21 / Keras 3 in this venv: the same
    214 shapes in the same order, 25,583,592 trainable params (+ 53,120 non-trainable BN
    statistics = 25,636,712 total).
    """
    shapes: List[Shape] = []

    def conv(k: int, cin: int, cout: int) -> List[Shape]:
        return [(k, k, cin, cout), (cout,)]  # kernel, bias

    def bn(c: int) -> List[Shape]:
        return [(c,), (c,)]  # gamma, beta

    shapes += conv(7, 3, 64) + bn(64)  # conv1
    cin = 64
    for filters, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3)):
        out = 4 * filters
        for b in range(blocks):
            shapes += conv(1, cin, filters) + bn(filters) + conv(3, filters, filters) + bn(filters)
            if b == 0:  # projection shortcut; Keras orders 0_conv, 3_conv, 0_bn, 3_bn
                shapes += conv(1, cin, out) + conv(1, filters, out) + bn(out) + bn(out)
            else:
                shapes += conv(1, filters, out) + bn(out)
            cin = out
    shapes.extend([(2048, 1000), (1000,)])  # predictions dense
    return shapes

"""The zoo's architectures (issue 27 item 6): models beyond the five benchmark models, each with
seeded random weights (no downloads), built from torchvision, transformers configs, or written here
from the blocks their families use. bench/zoo.py exports, checks and times them.

Each entry: build() -> an fp32 eval nn.Module whose forward takes the named inputs and returns one
tensor or a tuple of tensors; inputs: name -> (kind, shape without the batch dim); large: the large
batch. Kinds: "float" ~ N(0, 1), "audio" ~ 0.1 N(0, 1) (a waveform), "ids" uniform in [0, vocab),
"ones" (attention masks), "timestep" uniform in [0, 1000).
"""
import math
from dataclasses import dataclass, field


@dataclass
class Arch:
    name: str
    family: str
    build: object  # () -> (module, vocab or None)
    inputs: dict
    large: int
    what: str  # the ops it leans on
    outputs: list = field(default_factory=lambda: ["output"])


def _torch():
    import torch
    return torch


def calibrate_bn(model, inputs):
    """A fresh BatchNorm is the identity: in random deep nets the activations then shrink to
    underflow fp16 or grow past its range. Set running_var from seeded random inputs (running_mean
    stays 0, as bench/peers.py does for MobileNetV2)."""
    torch = _torch()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    with torch.no_grad():
        model(*inputs.values())
    for bn in bns:
        bn.running_mean.zero_()
    return model.eval()


class Named:
    """Wraps a module so that forward takes the ONNX input names as keywords."""

    @staticmethod
    def image(net, pick=None):
        torch = _torch()

        class Image(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, pixel_values):
                y = self.net(pixel_values)
                if pick == "out":
                    return y["out"]
                if pick == "levels":  # FPN: a dict of levels, as a tuple
                    return tuple(y.values())
                if pick == "logits":
                    return y.logits
                return y
        return Image()


# ---- torchvision ----------------------------------------------------------------------------------

def torchvision_classifier(name):
    def build():
        import torchvision
        m = torchvision.models.get_model(name, weights=None)
        return Named.image(m).eval(), None
    return build


def deeplabv3():
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large
    m = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=21, aux_loss=False)
    return Named.image(m, "out").eval(), None


def fpn_resnet50():
    import torch
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    m = resnet_fpn_backbone(backbone_name="resnet50", weights=None, trainable_layers=5,
                            norm_layer=torch.nn.BatchNorm2d)
    return Named.image(m, "levels").eval(), None


# ---- written here ---------------------------------------------------------------------------------

def yolo_neck():
    """A YOLOv8-n-shaped detector without the box decoding: Conv-BN-SiLU, C2f blocks (Split and
    Concat), SPPF (three chained 5x5 max pools), a PAN neck (nearest 2x upsampling, Concat), three
    1x1 heads."""
    import torch
    from torch import nn

    def conv(c1, c2, k=3, s=1):
        return nn.Sequential(nn.Conv2d(c1, c2, k, s, k // 2, bias=False), nn.BatchNorm2d(c2), nn.SiLU())

    class C2f(nn.Module):
        def __init__(self, c1, c2, n=1):
            super().__init__()
            self.c = c2 // 2
            self.cv1, self.cv2 = conv(c1, 2 * self.c, 1), conv((2 + n) * self.c, c2, 1)
            self.m = nn.ModuleList(nn.Sequential(conv(self.c, self.c), conv(self.c, self.c)) for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            for m in self.m:
                y.append(y[-1] + m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, c1, c2):
            super().__init__()
            self.cv1, self.cv2, self.m = conv(c1, c1 // 2, 1), conv(c1 * 2, c2, 1), nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            x = self.cv1(x)
            y1 = self.m(x)
            y2 = self.m(y1)
            return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))

    class Yolo(nn.Module):
        def __init__(self, w=(16, 32, 64, 128, 256), classes=80):
            super().__init__()
            self.stem = nn.Sequential(conv(3, w[0], 3, 2), conv(w[0], w[1], 3, 2), C2f(w[1], w[1]))
            self.p3 = nn.Sequential(conv(w[1], w[2], 3, 2), C2f(w[2], w[2], 2))
            self.p4 = nn.Sequential(conv(w[2], w[3], 3, 2), C2f(w[3], w[3], 2))
            self.p5 = nn.Sequential(conv(w[3], w[4], 3, 2), C2f(w[4], w[4]), SPPF(w[4], w[4]))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.t4, self.t3 = C2f(w[4] + w[3], w[3]), C2f(w[3] + w[2], w[2])
            self.d3, self.b4 = conv(w[2], w[2], 3, 2), C2f(w[2] + w[3], w[3])
            self.d4, self.b5 = conv(w[3], w[3], 3, 2), C2f(w[3] + w[4], w[4])
            self.heads = nn.ModuleList(nn.Conv2d(c, 4 * 16 + classes, 1) for c in (w[2], w[3], w[4]))

        def forward(self, pixel_values):
            p3 = self.p3(self.stem(pixel_values))
            p4 = self.p4(p3)
            p5 = self.p5(p4)
            t4 = self.t4(torch.cat((self.up(p5), p4), 1))
            n3 = self.t3(torch.cat((self.up(t4), p3), 1))
            n4 = self.b4(torch.cat((self.d3(n3), t4), 1))
            n5 = self.b5(torch.cat((self.d4(n4), p5), 1))
            return tuple(h(x) for h, x in zip(self.heads, (n3, n4, n5)))
    return Yolo().eval(), None


def unet_diffusion():
    """A latent-diffusion-shaped UNet: sinusoidal timestep embedding (Exp, Sin, Cos), ResBlocks with
    GroupNorm(32) + SiLU and the embedding added per channel, strided-conv downsampling, self-attention
    at the lowest resolution, ConvTranspose upsampling, skip Concats."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Res(nn.Module):
        def __init__(self, c1, c2, temb):
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(32, c1), nn.Conv2d(c1, c2, 3, padding=1)
            self.t = nn.Linear(temb, c2)
            self.n2, self.c2 = nn.GroupNorm(32, c2), nn.Conv2d(c2, c2, 3, padding=1)
            self.skip = nn.Conv2d(c1, c2, 1) if c1 != c2 else nn.Identity()

        def forward(self, x, emb):
            h = self.c1(F.silu(self.n1(x))) + self.t(F.silu(emb))[:, :, None, None]
            return self.skip(x) + self.c2(F.silu(self.n2(h)))

    class Attn(nn.Module):
        def __init__(self, c, heads=4):
            super().__init__()
            self.heads, self.norm = heads, nn.GroupNorm(32, c)
            self.qkv, self.proj = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

        def forward(self, x):
            b, c, h, w = x.shape
            q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).unbind(1)
            a = torch.softmax(q.transpose(-1, -2) @ k / math.sqrt(c // self.heads), dim=-1)
            return x + self.proj((v @ a.transpose(-1, -2)).reshape(b, c, h, w))

    class UNet(nn.Module):
        def __init__(self, ch=(64, 128, 256), cin=4):
            super().__init__()
            self.ch0, temb = ch[0], 4 * ch[0]
            self.temb = nn.Sequential(nn.Linear(ch[0], temb), nn.SiLU(), nn.Linear(temb, temb))
            self.inp = nn.Conv2d(cin, ch[0], 3, padding=1)
            self.down = nn.ModuleList(Res(a, b, temb) for a, b in zip((ch[0],) + ch[:-1], ch))
            self.pool = nn.ModuleList(nn.Conv2d(c, c, 3, stride=2, padding=1) for c in ch[:-1])
            self.mid1, self.attn, self.mid2 = Res(ch[-1], ch[-1], temb), Attn(ch[-1]), Res(ch[-1], ch[-1], temb)
            self.upconv = nn.ModuleList(nn.ConvTranspose2d(c, c, 4, stride=2, padding=1) for c in ch[:0:-1])
            outs = ch[::-1]  # each up block: the previous block's output and the skip in, the skip's width out
            self.up = nn.ModuleList(Res((outs[i - 1] if i else ch[-1]) + c, c, temb) for i, c in enumerate(outs))
            self.out = nn.Sequential(nn.GroupNorm(32, ch[0]), nn.SiLU(), nn.Conv2d(ch[0], cin, 3, padding=1))

        def forward(self, sample, timestep):
            half = self.ch0 // 2
            freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=sample.device) / half)
            t = timestep[:, None].float() * freqs[None]
            emb = self.temb(torch.cat((torch.cos(t), torch.sin(t)), dim=1).to(sample.dtype))
            h = self.inp(sample)
            skips = []
            for i, blk in enumerate(self.down):
                h = blk(h, emb)
                skips.append(h)
                if i < len(self.pool):
                    h = self.pool[i](h)
            h = self.mid2(self.attn(self.mid1(h, emb)), emb)
            for i, blk in enumerate(self.up):
                if i > 0:
                    h = self.upconv[i - 1](h)
                h = blk(torch.cat((h, skips.pop()), dim=1), emb)
            return self.out(h)

    m = UNet()
    for mod in m.modules():  # non-trivial GroupNorm affine parameters
        if isinstance(mod, nn.GroupNorm):
            nn.init.uniform_(mod.weight, 0.5, 1.5)
            nn.init.uniform_(mod.bias, -0.2, 0.2)
    return m.eval(), None


def speech_lstm():
    """A DeepSpeech2-shaped encoder: two strided Conv1d + BatchNorm + GELU over 80 log-mel features,
    a two-layer bidirectional LSTM, a linear CTC head with log_softmax."""
    import torch
    from torch import nn

    class Speech(nn.Module):
        def __init__(self, feats=80, hid=256, vocab=32):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv1d(feats, hid, 5, stride=2, padding=2), nn.BatchNorm1d(hid), nn.GELU(),
                                      nn.Conv1d(hid, hid, 5, stride=2, padding=2, groups=4), nn.BatchNorm1d(hid),
                                      nn.GELU())
            self.rnn = nn.LSTM(hid, hid, num_layers=2, bidirectional=True, batch_first=True)
            self.head = nn.Linear(2 * hid, vocab)

        def forward(self, features):
            h, _ = self.rnn(self.conv(features).transpose(1, 2))
            return torch.log_softmax(self.head(h), dim=-1)
    return Speech().eval(), None


def melspec_cnn():
    """An audio classifier with its log-mel front end in the graph: reflect pad, STFT (n_fft 512, hop
    160, Hann window of 400), power spectrum, a mel filterbank as a MatMul, log, then a small CNN."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    def mel_filters(n_freq, n_mels=64, sr=16000):
        mel = lambda f: 2595.0 * math.log10(1.0 + f / 700.0)
        pts = [700.0 * (10 ** (m / 2595.0) - 1.0) for m in
               [mel(0) + (mel(sr / 2) - mel(0)) * i / (n_mels + 1) for i in range(n_mels + 2)]]
        freqs = torch.linspace(0, sr / 2, n_freq)
        fb = torch.zeros(n_mels, n_freq)
        for i in range(n_mels):
            lo, c, hi = pts[i], pts[i + 1], pts[i + 2]
            fb[i] = torch.clamp(torch.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)), min=0)
        return fb

    class Mel(nn.Module):
        def __init__(self, classes=35):
            super().__init__()
            self.register_buffer("window", torch.hann_window(400))
            self.register_buffer("fb", mel_filters(257))
            blk = lambda a, b: [nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU(), nn.MaxPool2d(2)]
            self.cnn = nn.Sequential(*blk(1, 32), *blk(32, 64), *blk(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                     nn.Linear(128, classes))

        def forward(self, waveform):
            x = F.pad(waveform[:, None, :], (256, 256), mode="reflect")[:, 0, :]
            spec = torch.stft(x, 512, hop_length=160, win_length=400, window=self.window, center=False,
                              return_complex=False)
            power = spec.pow(2).sum(-1)  # [batch, 257, frames]
            logmel = torch.log(torch.matmul(self.fb, power) + 1e-6)
            return self.cnn(logmel[:, None])
    return Mel().eval(), None


# ---- transformers ---------------------------------------------------------------------------------

def hf(model_cls, config_cls, names, out="last_hidden_state", call=None, attn="eager", **cfg):
    """A transformers model with a default-size config, called with the inputs `names` in order (and
    the keywords `call`); attention as plain ops (eager), the same math in every peer, unless `attn`
    names another implementation ("sdpa": transformers' default, F.scaled_dot_product_attention,
    which the exporters decompose their own way)."""
    def build():
        import torch
        import transformers
        c = getattr(transformers, config_cls)(attn_implementation=attn, **cfg)
        net = getattr(transformers, model_cls)(c)
        if getattr(net.config, "_attn_implementation", attn) != attn:
            net.set_attn_implementation(attn)
        from torch.nn.utils import parametrize
        for mod in list(net.modules()):  # weight_norm (wav2vec2): its value, as a deployed model has it
            for pname in list(getattr(mod, "parametrizations", {}) or {}):
                parametrize.remove_parametrizations(mod, pname, leave_parametrized=True)

        class Text(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, *args):
                return getattr(self.net(**dict(zip(names, args)), **(call or {})), out)
        return Text().eval(), getattr(c, "vocab_size", None)
    return build


def gpt2_kv():
    """GPT-2 (124M) as the default export writes it: logits and every layer's present keys and values
    (use_cache=True), the KV outputs the decoders' users deploy."""
    import torch
    import transformers
    net = transformers.GPT2LMHeadModel(transformers.GPT2Config(attn_implementation="eager"))

    class Gpt2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids):
            y = self.net(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=True)
            kv = y.past_key_values
            layers = kv.layers if hasattr(kv, "layers") else None
            flat = [t for l in layers for t in (l.keys, l.values)] if layers is not None else \
                [t for pair in kv for t in pair]
            return (y.logits, *flat)
    return Gpt2().eval(), net.config.vocab_size


IMG224 = {"pixel_values": ("float", (3, 224, 224))}
LLAMA = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
TEXT = {"input_ids": ("ids", (128,)), "attention_mask": ("ones", (128,))}

ARCHS = [
    Arch("regnet_y_400mf", "cnn", torchvision_classifier("regnet_y_400mf"), IMG224, 128, "grouped conv, squeeze-excite"),
    Arch("densenet121", "cnn", torchvision_classifier("densenet121"), IMG224, 64, "a Concat per layer"),
    Arch("efficientnet_b0", "cnn", torchvision_classifier("efficientnet_b0"), IMG224, 128, "depthwise, SiLU, SE"),
    Arch("convnext_tiny", "cnn", torchvision_classifier("convnext_tiny"), IMG224, 64,
         "7x7 depthwise, channels-last LayerNorm, GELU"),
    Arch("mobilenet_v3_large", "cnn", torchvision_classifier("mobilenet_v3_large"), IMG224, 128, "hardswish, SE"),
    Arch("shufflenet_v2", "cnn", torchvision_classifier("shufflenet_v2_x1_0"), IMG224, 128,
         "channel shuffle (Reshape/Transpose), Split"),
    Arch("squeezenet1_1", "cnn", torchvision_classifier("squeezenet1_1"), IMG224, 128, "ceil-mode max pool, Concat"),
    Arch("swin_t", "vit", torchvision_classifier("swin_t"), IMG224, 64,
         "windowed attention: Pad, roll, relative position bias"),
    Arch("mobilevit", "vit", hf("MobileViTForImageClassification", "MobileViTConfig", ["pixel_values"], "logits"),
         {"pixel_values": ("float", (3, 256, 256))}, 64, "unfold/fold reshapes, conv + attention"),
    Arch("deeplabv3_mbv3", "segmentation", deeplabv3, {"pixel_values": ("float", (3, 512, 512))}, 16,
         "ASPP, bilinear Resize, dilated depthwise"),
    Arch("fpn_resnet50", "detection", fpn_resnet50, {"pixel_values": ("float", (3, 512, 512))}, 16,
         "FPN neck: nearest Resize to a size, max-pool level", ["p2", "p3", "p4", "p5", "pool"]),
    Arch("yolo_neck", "detection", yolo_neck, {"pixel_values": ("float", (3, 640, 640))}, 32,
         "C2f (Split, Concat), SPPF, PAN with nearest upsampling", ["p3", "p4", "p5"]),
    Arch("unet_diffusion", "unet", unet_diffusion, {"sample": ("float", (4, 64, 64)), "timestep": ("timestep", ())},
         16, "GroupNorm+SiLU, ConvTranspose, attention, Sin/Cos embedding"),
    Arch("speech_lstm", "speech", speech_lstm, {"features": ("float", (80, 400))}, 32,
         "Conv1d (grouped), bidirectional LSTM"),
    Arch("melspec_cnn", "speech", melspec_cnn, {"waveform": ("audio", (16000,))}, 64,
         "STFT, power spectrum, mel MatMul, log"),
    Arch("wav2vec2", "speech", hf("Wav2Vec2Model", "Wav2Vec2Config", ["input_values"]),
         {"input_values": ("audio", (16000,))}, 16, "Conv1d stack, GroupNorm, grouped positional conv"),
    Arch("whisper_encoder", "speech", hf("WhisperForAudioClassification", "WhisperConfig", ["input_features"],
                                               "logits"),
         {"input_features": ("float", (80, 3000))}, 16, "Conv1d + GELU, encoder attention"),
    Arch("roberta", "text", hf("RobertaModel", "RobertaConfig", ["input_ids", "attention_mask"]), TEXT, 32,
         "position ids by CumSum"),
    Arch("bert_sdpa", "text", hf("BertModel", "BertConfig", ["input_ids", "attention_mask"], attn="sdpa"), TEXT, 32,
         "transformers' default attention (SDPA): Q and K scaled by sqrt(scale), NaN guard"),
    Arch("albert", "text", hf("AlbertModel", "AlbertConfig", ["input_ids", "attention_mask"],
                                    hidden_size=768, num_attention_heads=12, intermediate_size=3072), TEXT, 32,
         "shared layers, factorized embedding"),
    Arch("t5", "text", hf("T5Model", "T5Config", ["input_ids", "decoder_input_ids"], call={"use_cache": False}),
         {"input_ids": ("ids", (128,)), "decoder_input_ids": ("ids", (32,))}, 32,
         "encoder-decoder, relative position buckets (Log, Min, Where)"),
    Arch("llama_gqa", "text", hf("LlamaForCausalLM", "LlamaConfig", ["input_ids", "attention_mask"], "logits",
                                 **LLAMA), TEXT, 16, "GQA (4 KV heads), RoPE, RMSNorm, SwiGLU"),
    Arch("llama_sdpa", "text", hf("LlamaForCausalLM", "LlamaConfig", ["input_ids", "attention_mask"], "logits",
                                  attn="sdpa", **LLAMA), TEXT, 16,
         "llama_gqa with transformers' default attention: causal mask made in the graph, SDPA with GQA"),
    Arch("gpt2_kv", "text", gpt2_kv, {"input_ids": ("ids", (128,))}, 16, "use_cache=True: 24 KV outputs",
         ["logits"] + [f"present.{i}.{kv}" for i in range(12) for kv in ("key", "value")]),
]
BY_NAME = {a.name: a for a in ARCHS}


def make_inputs(arch, vocab, batch, seed=1):
    """Deterministic CPU inputs for one batch."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (kind, shape) in arch.inputs.items():
        full = (batch,) + tuple(shape)
        if kind == "float":
            out[name] = torch.randn(full, generator=g)
        elif kind == "audio":
            out[name] = 0.1 * torch.randn(full, generator=g)
        elif kind == "timestep":
            out[name] = torch.rand(full, generator=g) * 1000.0
        elif kind == "ids":
            out[name] = torch.randint(0, vocab, full, generator=g, dtype=torch.int64)
        elif kind == "ones":
            out[name] = torch.ones(full, dtype=torch.int64)
        else:
            raise ValueError(f"{arch.name}: unknown input kind {kind}")
    return out


def build(arch):
    """(fp32 eval module with seeded random weights, vocab or None); BatchNorm statistics set."""
    torch = _torch()
    torch.manual_seed(0)
    m, vocab = arch.build()
    return calibrate_bn(m, make_inputs(arch, vocab, 8, seed=2)), vocab

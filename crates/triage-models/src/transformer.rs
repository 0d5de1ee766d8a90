//! The decoder-only transformer shared by the supported architectures (their files say how they
//! differ). The forward pass takes token ids, their positions and an `AttentionBackend`; it owns
//! no cache policy.

use candle_core::{DType, Device, Tensor};
use triage_ops::upload_u32;
use triage_ops::QkvShape;

use crate::attention::AttentionBackend;
use crate::config::ModelConfig;
use crate::device::DeviceSpec;
use crate::fused_linear::FusedLinear;
use crate::layers::{DenseLayout, Embedding, Linear, Mlp, RmsNorm, RopeAt, RotaryEmbedding};
use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// Most positions the rotary tables are precomputed for (longer contexts are refused).
pub const MAX_ROPE_POSITIONS: usize = 131_072;

#[derive(Debug, Clone)]
struct DecoderLayer {
    attn_norm: RmsNorm,
    /// Q, K and V projections, in that order.
    qkv: FusedLinear,
    o: Linear,
    /// Qwen3's per-head norms of Q and K (`head_dim` wide), applied before rope.
    qk_norm: Option<QkNorm>,
    ffn_norm: RmsNorm,
    mlp: Mlp,
}

/// The RMS norms of each Q head and each K head (Qwen3).
#[derive(Debug, Clone)]
struct QkNorm {
    q: RmsNorm,
    k: RmsNorm,
}

impl QkNorm {
    /// The norms applied to a stacked projection (`[n, (heads + 2 kv_heads) · head_dim]`, in
    /// the activations' dtype): Q and K normalised head by head in f32, V as it was.
    fn stacked(&self, qkv: &Tensor, c: &ModelConfig) -> Result<Tensor> {
        let (n, d, dtype) = (qkv.dim(0)?, c.head_dim, qkv.dtype());
        let part = |start: usize, heads: usize, norm: Option<&RmsNorm>| -> Result<Tensor> {
            let x = qkv.narrow(1, start * d, heads * d)?;
            let Some(norm) = norm else {
                return Ok(x);
            };
            let rows = x
                .contiguous()?
                .reshape((n * heads, d))?
                .to_dtype(DType::F32)?;
            Ok(norm.forward_to(&rows, dtype)?.reshape((n, heads * d))?)
        };
        let q = part(0, c.num_heads, Some(&self.q))?;
        let k = part(c.num_heads, c.num_kv_heads, Some(&self.k))?;
        let v = part(c.num_heads + c.num_kv_heads, c.num_kv_heads, None)?;
        Ok(Tensor::cat(&[q, k, v], 1)?)
    }
}

/// The dtype every layer's stacked QKV and gate/up share, when both are stacked dense bf16 or
/// f16 matrices and the output and down projections are plain matrices of that dtype.
fn fused_activations(layers: &[DecoderLayer]) -> Option<DType> {
    let dtype = layers.first()?.qkv.dense_dtype()?;
    let same = |l: &DecoderLayer| {
        l.qkv.dense_dtype() == Some(dtype)
            && l.mlp.gate_up.dense_dtype() == Some(dtype)
            && l.o.dense_dtype() == Some(dtype)
            && l.mlp.down.dense_dtype() == Some(dtype)
    };
    layers.iter().all(same).then_some(dtype)
}

/// One forward pass's per-token inputs, on the model's device.
#[derive(Debug, Clone)]
pub struct ForwardInputs {
    /// `[n]` u32.
    pub token_ids: Tensor,
    /// `[n]` u32: each token's position in its sequence.
    pub positions: Tensor,
    /// `[rows]` u32: the rows whose logits (and hidden states) are returned; `None` for all.
    pub logits_rows: Option<Tensor>,
}

/// A loaded decoder-only transformer.
#[derive(Debug, Clone)]
pub struct Transformer {
    config: ModelConfig,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: RotaryEmbedding,
    device: Device,
    /// The activations' dtype between the GEMMs when every layer's matrices are plain bf16 or
    /// f16 (the GPU's layout): the pass then runs `forward_fused`. `None`: f32 activations.
    activations: Option<DType>,
}

/// How weights are laid out in memory.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    /// Keep an f32 copy of quantized matrices for multi-row products (~4 bytes per parameter).
    /// Off by default: the int8 products on the quantized blocks match or beat the f32 GEMM in
    /// prefill (`benches/RESULTS.md`, issue 21) at a quarter of the memory or less.
    pub dense_prefill: bool,
    /// Dtype of dense matrices (safetensors weights, GGUF F16/BF16/F32 matrices).
    pub dense_dtype: DType,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dense_prefill: false,
            dense_dtype: DType::F32,
        }
    }
}

impl LoadOptions {
    /// The layout for `spec`: on the CPU f32 dense matrices; on a GPU quantized blocks through
    /// candle's CUDA kernels and dense matrices in bf16. Neither keeps f32 copies of quantized
    /// blocks.
    pub fn for_device(spec: DeviceSpec) -> Result<Self> {
        Ok(match spec {
            DeviceSpec::Cpu => Self::default(),
            DeviceSpec::Cuda(_) => Self {
                device: spec.open()?,
                dense_prefill: false,
                dense_dtype: DType::BF16,
            },
        })
    }

    fn layout(&self, dense_copy: bool) -> DenseLayout {
        DenseLayout {
            dtype: self.dense_dtype,
            dense_copy: dense_copy && self.dense_prefill,
        }
    }
}

/// Reads a transformer's parts from a weight source in one layout: the loader's steps.
struct PartReader<'a> {
    opts: &'a LoadOptions,
}

impl PartReader<'_> {
    fn dev(&self) -> &Device {
        &self.opts.device
    }

    fn bias(&self, w: &mut WeightSource, name: &str, bias: bool) -> Result<Option<Tensor>> {
        let dev = self.dev();
        match bias {
            true => Ok(Some(
                w.get(&format!("{name}.bias"), dev)?.to_dense_f32(dev)?,
            )),
            false => Ok(None),
        }
    }

    fn linear(&self, w: &mut WeightSource, name: &str, bias: bool) -> Result<Linear> {
        let weight = w.get_matrix(&format!("{name}.weight"), self.dev())?;
        let bias = self.bias(w, name, bias)?;
        Linear::new(weight, bias, self.opts.layout(true), self.dev())
    }

    /// Parts that multiply one input are read as one stacked matrix where they can be.
    fn fused(&self, w: &mut WeightSource, names: &[String], bias: bool) -> Result<FusedLinear> {
        let weights: Vec<String> = names.iter().map(|n| format!("{n}.weight")).collect();
        let stacked = match self.opts.layout(true).dense_copy {
            true => None,
            false => w.get_stacked(&weights, self.dev())?,
        };
        let Some((matrix, widths)) = stacked else {
            let parts = names.iter().map(|n| self.linear(w, n, bias));
            return FusedLinear::new(parts.collect::<Result<_>>()?);
        };
        let biases = names.iter().map(|n| self.bias(w, n, bias));
        Ok(FusedLinear::from_stacked(
            matrix,
            widths,
            biases.collect::<Result<_>>()?,
        ))
    }

    fn norm(&self, w: &mut WeightSource, name: &str, config: &ModelConfig) -> Result<RmsNorm> {
        RmsNorm::new(w.get(name, self.dev())?, config.rms_norm_eps, self.dev())
    }

    /// Decoder layer `i`: its parts in the order the GGUF names them.
    fn decoder_layer(
        &self,
        w: &mut WeightSource,
        config: &ModelConfig,
        i: usize,
    ) -> Result<DecoderLayer> {
        let p = format!("blk.{i}");
        let qkv = [
            format!("{p}.attn_q"),
            format!("{p}.attn_k"),
            format!("{p}.attn_v"),
        ];
        crate::expected_shapes::check_layer(w, config, i)?;
        let qk_norm = match config.qk_norm {
            true => Some(QkNorm {
                q: self.norm(w, &format!("{p}.attn_q_norm.weight"), config)?,
                k: self.norm(w, &format!("{p}.attn_k_norm.weight"), config)?,
            }),
            false => None,
        };
        Ok(DecoderLayer {
            attn_norm: self.norm(w, &format!("{p}.attn_norm.weight"), config)?,
            qkv: self.fused(w, &qkv, config.qkv_bias)?,
            o: self.linear(w, &format!("{p}.attn_output"), false)?,
            qk_norm,
            ffn_norm: self.norm(w, &format!("{p}.ffn_norm.weight"), config)?,
            mlp: Mlp {
                gate_up: self.fused(w, &[format!("{p}.ffn_gate"), format!("{p}.ffn_up")], false)?,
                down: self.linear(w, &format!("{p}.ffn_down"), false)?,
            },
        })
    }

    /// The token embedding, the LM head (the embedding itself when tied) and the final norm.
    fn ends(
        &self,
        w: &mut WeightSource,
        config: &ModelConfig,
    ) -> Result<(Embedding, Linear, RmsNorm)> {
        let dev = self.dev();
        crate::expected_shapes::check_ends(w, config)?;
        let embed = Embedding::new(
            w.get_matrix("token_embd.weight", dev)?,
            self.opts.dense_dtype,
            dev,
        )?;
        // Only the last row of a prompt reaches the LM head, so it stays quantized (no dense copy).
        let head = self.opts.layout(false);
        let lm_head = if config.tie_embeddings {
            Linear::new(embed.weight().clone(), None, head, dev)?
        } else {
            Linear::new(w.get_matrix("output.weight", dev)?, None, head, dev)?
        };
        let norm = self.norm(w, "output_norm.weight", config)?;
        Ok((embed, lm_head, norm))
    }
}

impl Transformer {
    /// Build the model from its config and a weight source.
    pub fn load(
        config: ModelConfig,
        weights: &mut WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let dev = &opts.device;
        let reader = PartReader { opts };
        let layers = (0..config.num_layers)
            .map(|i| reader.decoder_layer(weights, &config, i))
            .collect::<Result<Vec<_>>>()?;
        let (embed, lm_head, norm) = reader.ends(weights, &config)?;
        let positions = config.context_length.min(MAX_ROPE_POSITIONS);
        let rope = RotaryEmbedding::new(
            config.head_dim,
            positions,
            config.rope_theta,
            config.rope_style,
            &config.rope_scaling,
            dev,
        )?;
        Self::check_shapes(&config, &embed, &layers)?;
        let activations = fused_activations(&layers);
        Ok(Self {
            activations,
            config,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            device: dev.clone(),
        })
    }

    fn check_shapes(
        config: &ModelConfig,
        embed: &Embedding,
        layers: &[DecoderLayer],
    ) -> Result<()> {
        let q_out = config.num_heads * config.head_dim;
        let kv_out = config.num_kv_heads * config.head_dim;
        for (i, l) in layers.iter().enumerate() {
            if l.qkv.out_features()? != [q_out, kv_out, kv_out] {
                return Err(ModelError::Invalid(format!(
                    "layer {i}: projection shapes do not match {} heads / {} kv heads of {}",
                    config.num_heads, config.num_kv_heads, config.head_dim
                )));
            }
        }
        if embed.vocab_size() != config.vocab_size {
            return Err(ModelError::Invalid(format!(
                "embedding has {} rows, config says vocab {}",
                embed.vocab_size(),
                config.vocab_size
            )));
        }
        Ok(())
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Run `token_ids` at `positions` through the model, storing K/V through `attn`, and return the
    /// logits (`[logits_rows.len(), vocab]`, f32) of the rows named in `logits_rows`.
    pub fn forward(
        &self,
        token_ids: &[u32],
        positions: &[u32],
        logits_rows: &[usize],
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        Ok(self
            .forward_with_hidden(token_ids, positions, logits_rows, &[], attn)?
            .0)
    }

    /// [`Self::forward`], also returning the residual stream after each layer of
    /// `hidden_layers` (0-based) at the `logits_rows`: one `[logits_rows.len(), hidden]` tensor
    /// per layer, in the order asked. They come from the same pass, at no extra compute.
    pub fn forward_with_hidden(
        &self,
        token_ids: &[u32],
        positions: &[u32],
        logits_rows: &[usize],
        hidden_layers: &[usize],
        attn: &mut dyn AttentionBackend,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let inputs = self.inputs(token_ids, positions, logits_rows)?;
        let (logits, hidden) = self.forward_inputs(&inputs, hidden_layers, attn)?;
        Ok((logits.to_dtype(DType::F32)?, hidden))
    }

    /// A pass's inputs checked on the host ([`Self::check_tokens`], `logits_rows` inside the
    /// pass) and uploaded to the model's device, for [`Self::forward_inputs`].
    pub fn inputs(
        &self,
        token_ids: &[u32],
        positions: &[u32],
        logits_rows: &[usize],
    ) -> Result<ForwardInputs> {
        let n = token_ids.len();
        if positions.len() != n {
            return Err(ModelError::Invalid(format!(
                "forward: {n} tokens with {} positions",
                positions.len()
            )));
        }
        self.check_tokens(token_ids, positions)?;
        if let Some(&bad) = logits_rows.iter().find(|&&r| r >= n) {
            return Err(ModelError::Invalid(format!(
                "logits row {bad} of {n} tokens"
            )));
        }
        let dev = &self.device;
        let rows: Vec<u32> = logits_rows.iter().map(|&r| r as u32).collect();
        Ok(ForwardInputs {
            token_ids: upload_u32(token_ids, dev, "token ids")?,
            positions: upload_u32(positions, dev, "positions")?,
            logits_rows: Some(upload_u32(&rows, dev, "logits rows")?),
        })
    }

    /// The activations' dtype between the GEMMs when the pass runs fused (every layer's
    /// matrices plain bf16 or f16: the GPU's layout); `None` when they are f32.
    pub fn activations(&self) -> Option<DType> {
        self.activations
    }

    /// The dtype of [`Self::forward_inputs`]' logits: the LM head's (f32 on the CPU; bf16 for a
    /// dense bf16 head on a GPU, which halves what the logits reduction reads).
    pub fn logits_dtype(&self) -> DType {
        self.lm_head.output_dtype()
    }

    /// Token ids inside the vocabulary and positions inside the rotary tables: what a forward
    /// pass checks on the host before it runs, and a captured step before each replay.
    pub fn check_tokens(&self, token_ids: &[u32], positions: &[u32]) -> Result<()> {
        if token_ids.is_empty() {
            return Err(ModelError::Invalid("forward: no tokens".into()));
        }
        if let Some(&bad) = token_ids
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(ModelError::Invalid(format!(
                "token id {bad} outside the vocabulary"
            )));
        }
        let max_pos = positions.iter().copied().max().unwrap_or(0) as usize;
        if max_pos >= self.max_positions() {
            return Err(ModelError::Invalid(format!(
                "position {max_pos} beyond the context length {}",
                self.config.context_length
            )));
        }
        Ok(())
    }

    /// Positions the rotary tables cover: the context length, at most [`MAX_ROPE_POSITIONS`].
    pub fn max_positions(&self) -> usize {
        self.config.context_length.min(MAX_ROPE_POSITIONS)
    }

    /// The forward pass over inputs already on the device, checked by the caller
    /// ([`Self::check_tokens`]): no host data enters it, so a captured step can run it. The
    /// logits are in [`Self::logits_dtype`]; the hidden states f32.
    pub fn forward_inputs(
        &self,
        inputs: &ForwardInputs,
        hidden_layers: &[usize],
        attn: &mut dyn AttentionBackend,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        if let Some(&bad) = hidden_layers.iter().find(|&&l| l >= self.layers.len()) {
            return Err(ModelError::Invalid(format!(
                "hidden states of layer {bad} asked of a model with {} layers",
                self.layers.len()
            )));
        }
        let n = inputs.token_ids.dim(0)?;
        if n == 0 || inputs.positions.dims() != [n] {
            return Err(ModelError::Invalid(format!(
                "forward: {n} tokens with positions {:?}",
                inputs.positions.dims()
            )));
        }
        let select = |x: &Tensor| -> Result<Tensor> {
            Ok(match &inputs.logits_rows {
                Some(rows) => x.index_select(rows, 0)?,
                None => x.clone(),
            })
        };
        let rope = self.rope.at(&inputs.positions)?;
        if let Some(dtype) = self.activations {
            return self.forward_fused(inputs, hidden_layers, attn, &rope, dtype);
        }
        let mut hidden: Vec<Option<Tensor>> = vec![None; hidden_layers.len()];
        let mut x = self.embed.forward(&inputs.token_ids)?;
        for (idx, layer) in self.layers.iter().enumerate() {
            let h = layer.attn_norm.forward(&x)?;
            let attn_out = self.attention(layer, idx, &h, &rope, n, attn)?;
            x = (x + layer.o.forward(&attn_out)?)?;
            let h = layer.ffn_norm.forward(&x)?;
            x = (x + layer.mlp.forward(&h)?)?;
            for (slot, _) in hidden_layers.iter().enumerate().filter(|(_, &l)| l == idx) {
                hidden[slot] = Some(select(&x)?.to_dtype(DType::F32)?);
            }
        }
        let x = self.norm.forward(&select(&x)?.contiguous()?)?;
        // Every asked layer was checked to exist, so each slot was filled in the loop.
        let hidden = hidden.into_iter().flatten().collect();
        Ok((self.lm_head.forward_in_weight_dtype(&x)?, hidden))
    }

    /// The pass with bf16 or f16 activations between the GEMMs (`Self::activations`): per
    /// layer one GEMM for Q, K and V, rope, the paged cache write and attention, one GEMM for
    /// the output projection, the residual add fused into the next norm, one GEMM for gate and
    /// up, `silu_mul`, one GEMM down. The residual stream stays f32, updated in place.
    fn forward_fused(
        &self,
        inputs: &ForwardInputs,
        hidden_layers: &[usize],
        attn: &mut dyn AttentionBackend,
        rope: &RopeAt,
        dtype: DType,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let select = |x: &Tensor| -> Result<Tensor> {
            Ok(match &inputs.logits_rows {
                Some(rows) => x.index_select(rows, 0)?,
                None => x.clone(),
            })
        };
        let mut hidden: Vec<Option<Tensor>> = vec![None; hidden_layers.len()];
        // The norms update the residual in place. A lookup always makes fresh storage (an
        // index_select, a dequantized gather or packed rows; the conversion to f32 at most
        // converts it), so nothing else holds it and no copy is needed.
        let x = self.embed.forward(&inputs.token_ids)?;
        let first = self
            .layers
            .first()
            .ok_or_else(|| ModelError::Invalid("no layers".into()))?;
        let mut h = first.attn_norm.forward_to(&x, dtype)?;
        for (idx, layer) in self.layers.iter().enumerate() {
            let attn_out = self.attention_fused(layer, idx, &h, rope, attn)?;
            let o = layer.o.forward_in_weight_dtype(&attn_out)?;
            h = layer.ffn_norm.add_forward(&x, &o)?;
            let down = self.mlp_fused(layer, &h)?;
            let next_norm = match self.layers.get(idx + 1) {
                Some(next) => &next.attn_norm,
                None => &self.norm,
            };
            h = next_norm.add_forward(&x, &down)?;
            for (slot, _) in hidden_layers.iter().enumerate().filter(|(_, &l)| l == idx) {
                // A copy: the residual changes under the next layer's norm.
                hidden[slot] = Some(select(&x)?.copy()?);
            }
        }
        let hidden = hidden.into_iter().flatten().collect();
        let h = select(&h)?.contiguous()?;
        Ok((self.lm_head.forward_in_weight_dtype(&h)?, hidden))
    }

    /// Q, K and V from one stacked GEMM in the activations' dtype, then bias, rope, the cache
    /// write and attention through `attn` (one kernel for the first three where it can).
    fn attention_fused(
        &self,
        layer: &DecoderLayer,
        layer_idx: usize,
        h: &Tensor,
        rope: &RopeAt,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let c = &self.config;
        let qkv = layer
            .qkv
            .stacked_product(h)?
            .ok_or_else(|| ModelError::Invalid("a fused layer without a stacked QKV".into()))?;
        // Qwen3 has no Q/K/V bias, so normalising before the backend adds the (absent) bias is
        // the order transformers applies them in.
        let qkv = match &layer.qk_norm {
            Some(norm) => norm.stacked(&qkv, c)?,
            None => qkv,
        };
        let shape = QkvShape {
            num_heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            neox: rope.is_neox(),
        };
        attn.attend_stacked(layer_idx, &qkv, layer.qkv.stacked_bias(), rope, shape)
    }

    /// Gate and up from one stacked GEMM, `silu_mul`, then down: all in the activations' dtype.
    fn mlp_fused(&self, layer: &DecoderLayer, h: &Tensor) -> Result<Tensor> {
        let gate_up =
            layer.mlp.gate_up.forward_stacked(h)?.ok_or_else(|| {
                ModelError::Invalid("a fused layer without a stacked gate/up".into())
            })?;
        let act = triage_ops::silu_mul(&gate_up)?;
        layer.mlp.down.forward_in_weight_dtype(&act)
    }

    fn attention(
        &self,
        layer: &DecoderLayer,
        layer_idx: usize,
        h: &Tensor,
        rope: &RopeAt,
        n: usize,
        attn: &mut dyn AttentionBackend,
    ) -> Result<Tensor> {
        let c = &self.config;
        let heads = |t: Tensor, num: usize| -> Result<Tensor> {
            // [n, num*d] -> [1, num, n, d]
            Ok(t.reshape((n, num, c.head_dim))?
                .transpose(0, 1)?
                .unsqueeze(0)?
                .contiguous()?)
        };
        let [q, k, v]: [Tensor; 3] = layer
            .qkv
            .forward(h)?
            .try_into()
            .map_err(|_| ModelError::Invalid("the attention's qkv has three parts".into()))?;
        let mut q = heads(q, c.num_heads)?;
        let mut k = heads(k, c.num_kv_heads)?;
        let v = heads(v, c.num_kv_heads)?;
        if let Some(norm) = &layer.qk_norm {
            q = norm.q.forward(&q)?;
            k = norm.k.forward(&k)?;
        }
        let q = rope.apply(&q)?.squeeze(0)?;
        let k = rope.apply(&k)?.squeeze(0)?;
        attn.attend(layer_idx, &q, &k, &v.squeeze(0)?)
    }
}

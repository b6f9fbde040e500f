//! The `unet` layer list: its size, names, shapes, limits and memory figures.

use super::*;

/// Every tensor of the default U-Net for 1 channel and 2 classes, counted level by level as
/// PyTorch counts the same network (Conv2d(bias=False) and BatchNorm2d's weight and bias).
#[test]
fn unet_has_the_parameters_of_its_definition() {
    let cfg = ModelConfig::new("unet", 1, 256, 256, 2).unwrap();
    let count: usize = cfg
        .trainable()
        .iter()
        .map(|t| t.1.iter().product::<usize>())
        .sum();
    // Two conv3x3 (no bias) from `cin` to `c`, then `c` to `c`, each followed by BN (2c).
    let double = |cin: usize, c: usize| cin * c * 9 + 2 * c + c * c * 9 + 2 * c;
    let enc =
        double(1, 32) + double(32, 64) + double(64, 128) + double(128, 256) + double(256, 512);
    // Up: conv1x1 from 2c to c, then the double conv of the concatenation (2c) to c.
    let dec = |c: usize| 2 * c * c + double(2 * c, c);
    let decs = dec(256) + dec(128) + dec(64) + dec(32);
    let head = 32 * 2 + 2;
    assert_eq!(enc, 9_632 + 55_552 + 221_696 + 885_760 + 3_540_992);
    assert_eq!(decs, 1_901_568 + 475_648 + 119_040 + 29_824);
    assert_eq!(enc + decs + head, 7_239_778);
    assert_eq!(count, 7_239_778);
    assert_eq!(cfg.parameter_bytes(), 12 * 7_239_778);
}

#[test]
fn unet_tensors_are_named_and_shaped_as_pytorch_names_them() {
    let cfg = ModelConfig::new("unet", 3, 64, 48, 5).unwrap();
    let tr = cfg.trainable();
    let get = |n: &str| {
        tr.iter()
            .find(|t| t.0 == n)
            .unwrap_or_else(|| panic!("no {n}"))
    };
    assert_eq!(get("enc1.conv1.weight").1, [32, 3, 3, 3]);
    assert_eq!(get("enc1.bn2.bias").1, [32]);
    assert_eq!(get("enc5.conv2.weight").1, [512, 512, 3, 3]);
    assert_eq!(get("dec4.up.weight").1, [256, 512, 1, 1]);
    assert_eq!(get("dec4.conv1.weight").1, [256, 512, 3, 3]);
    assert_eq!(get("dec1.bn2.weight").1, [32]);
    assert_eq!(
        get("head.weight"),
        &("head.weight".into(), vec![5, 32, 1, 1], true)
    );
    assert_eq!(get("head.bias"), &("head.bias".into(), vec![5], false));
    assert_eq!(tr.len(), 60);
    assert_eq!(cfg.buffers().len(), 2 * 18);
    // The head's bias starts at 0, its weight as every conv's (not all equal).
    let init = init_values(&cfg, 1);
    let val = |n: &str| &init.iter().find(|t| t.0 == n).unwrap().1;
    assert!(val("head.bias").iter().all(|&v| v == 0.0));
    assert!(val("head.weight")
        .iter()
        .any(|&v| v != val("head.weight")[0]));
    assert_eq!(init_values(&cfg, 1), init, "deterministic");
}

/// Logits at the input's size, whatever the rounding of the levels; the upsampling meets each
/// skip at its own size.
#[test]
fn unet_outputs_per_pixel_logits_at_any_size_that_fits() {
    for (h, w) in [(16, 16), (19, 23), (17, 40), (97, 131), (256, 256)] {
        let cfg = ModelConfig::new("unet", 1, h, w, 4).unwrap();
        let (layers, dims) = cfg.layers();
        assert_eq!(dims.last(), Some(&(4, h, w)), "{h}x{w}");
        assert_eq!(layers.last().unwrap().op, Op::Bias);
        for (i, l) in layers.iter().enumerate() {
            if l.op == Op::Concat {
                let (a, b) = (dims[l.inputs[0]], dims[l.inputs[1]]);
                assert_eq!((a.1, a.2), (b.1, b.2), "{h}x{w} {}", l.name);
                assert_eq!(dims[i + 1], (a.0 + b.0, a.1, a.2));
            }
        }
        let convs = cfg.convs(2);
        assert_eq!(convs.len(), 5 * 2 + 4 * 3 + 1);
        assert!(convs[0].1 && convs[1..].iter().all(|c| !c.1));
    }
}

#[test]
fn unet_needs_16x16_images_and_takes_a_width() {
    let e = ModelConfig::new("unet", 1, 15, 40, 2).unwrap_err();
    assert!(e.contains("at least 16x16") && e.contains("pool4"), "{e}");
    let cfg = ModelConfig::new("unet", 1, 16, 16, 2).unwrap();
    assert_eq!(cfg.base_width, None);
    let narrow = cfg.clone().with_base_width(8).unwrap();
    assert_eq!(narrow.trainable()[0].1, [8, 1, 3, 3]);
    assert!(cfg.clone().with_base_width(0).is_err());
    assert!(ModelConfig::small(1, 16, 16, 2).with_base_width(8).is_err());
    assert_eq!(default_lr("unet"), 0.1);
    assert!(MODELS.contains(&"unet"));
}

/// Recipes written before the width option load, and models without it write none.
#[test]
fn model_configs_without_a_width_read_and_write_as_before() {
    let old = r#"{"name":"small","channels":3,"height":32,"width":32,"classes":10}"#;
    let cfg: ModelConfig = serde_json::from_str(old).unwrap();
    assert_eq!(cfg, ModelConfig::small(3, 32, 32, 10));
    assert_eq!(serde_json::to_string(&cfg).unwrap(), old);
    let u = ModelConfig::unet(1, 64, 64, 2, 16);
    let back: ModelConfig = serde_json::from_str(&serde_json::to_string(&u).unwrap()).unwrap();
    assert_eq!(back, u);
}

/// `small` and `resnet18` keep the memory figure they had (three values of gradients in flight),
/// and the count of a U-Net's follows its skip connections.
#[test]
fn activation_bytes_count_the_gradients_in_flight() {
    let before = |cfg: &ModelConfig, n: usize, b: usize| {
        let (layers, dims) = cfg.layers();
        let size = |d: &Dims| (d.0 * d.1 * d.2) as u64;
        let outputs: u64 = dims.iter().map(size).sum();
        let winners: u64 = layers
            .iter()
            .enumerate()
            .filter(|(_, l)| matches!(l.op, Op::MaxPool { .. }))
            .map(|(i, _)| size(&dims[i + 1]))
            .sum();
        let largest = dims.iter().map(size).max().unwrap();
        n as u64 * ((outputs + 3 * largest) * b as u64 + winners)
    };
    for (m, h, w) in [
        ("small", 32, 32),
        ("resnet18", 32, 32),
        ("resnet18", 224, 224),
        ("resnet18", 97, 131),
    ] {
        let cfg = ModelConfig::new(m, 3, h, w, 10).unwrap();
        assert_eq!(
            cfg.activation_bytes(64, 2),
            before(&cfg, 64, 2),
            "{m} {h}x{w}"
        );
    }
    // The U-Net's peak: dec1's concatenation (backward runs it first of the four), whose
    // gradient (2w channels) and its inputs' (w each) are held at once at full resolution;
    // later the skips' gradients wait (enc1's, w, until the very end) beside smaller ones.
    let cfg = ModelConfig::unet(1, 64, 64, 2, 8);
    let (layers, dims) = cfg.layers();
    let px = 64 * 64;
    assert_eq!(gradients_in_flight(&layers, &dims), (16 + 8 + 8) * px);
    assert!(cfg.activation_bytes(4, 2) >= before(&cfg, 4, 2));
}

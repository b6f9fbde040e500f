use super::*;
use serde_json::json;

#[test]
fn msd_and_nnunet_descriptions_give_names_in_index_order() {
    let msd = json!({
        "name": "BRATS",
        "modality": {"1": "T1w", "0": "FLAIR"},
        "labels": {"0": "background", "2": "non-enhancing tumour", "1": "edema"},
        "numTraining": 2,
        "training": [
            {"image": "./imagesTr/a.nii.gz", "label": "./labelsTr/a.nii.gz"},
            {"image": "imagesTr//b.nii.gz", "label": "labelsTr/./b.nii.gz"}
        ],
        "test": ["./imagesTs/c.nii.gz"]
    });
    let d = describe(&msd).unwrap();
    assert_eq!(d.channels, ["FLAIR", "T1w"]);
    assert_eq!(d.labels, ["background", "edema", "non-enhancing tumour"]);
    assert_eq!(d.num_training, Some(2));
    assert_eq!(d.test_listed, Some(1));
    assert!(!d.per_channel_files);
    let t = d.training.unwrap();
    assert_eq!(
        (t[1].image.as_str(), t[1].label.as_str(), t[1].at),
        ("imagesTr/b.nii.gz", "labelsTr/b.nii.gz", 1)
    );

    let v2 = json!({
        "channel_names": {"0": "T2", "1": "ADC"},
        "labels": {"background": 0, "TZ": 2, "PZ": 1},
        "numTraining": 32,
        "file_ending": ".nii.gz"
    });
    let d = describe(&v2).unwrap();
    assert_eq!(d.channels, ["T2", "ADC"]);
    assert_eq!(d.labels, ["background", "PZ", "TZ"]);
    assert_eq!(d.ending.as_deref(), Some(".nii.gz"));
    assert!(d.per_channel_files && d.training.is_none());
}

#[test]
fn descriptions_that_cannot_be_used_say_why() {
    let err = |v: serde_json::Value| describe(&v).unwrap_err();
    assert_eq!(err(json!([1, 2])), "expected a JSON object, found an array");
    assert!(err(json!({"labels": {"0": "bg"}})).contains("no \"modality\" or \"channel_names\""));
    assert!(err(json!({"modality": {"0": "CT"}})).contains("no \"labels\""));
    let e = err(json!({
        "channel_names": {"0": "FLAIR"},
        "labels": {"background": 0, "whole tumor": [1, 2, 3], "core": [2, 3]}
    }));
    assert!(e.contains("\"whole tumor\" is a region ([1,2,3])"), "{e}");
    let e = err(json!({"modality": {"0": "CT", "2": "PET"}, "labels": {"0": "bg"}}));
    assert!(e.contains("\"modality\" has the key \"2\""), "{e}");
    let e = err(json!({"modality": {"0": "CT"}, "labels": {"bg": 0, "a": 2}}));
    assert!(e.contains("\"a\" has the value 2"), "{e}");
    let e = err(json!({"modality": {"0": "CT"}, "labels": {"bg": 0, "a": 0}}));
    assert!(e.contains("both have the value 0"), "{e}");
    let e = err(json!({"modality": {"0": "CT"}, "labels": {"0": "bg", "1": 1}}));
    assert!(e.contains("mixes"), "{e}");
    let e = err(json!({"modality": {"0": "CT"}, "labels": {"0": "bg"}, "file_ending": ".png"}));
    assert!(e.contains("file_ending \".png\""), "{e}");
    let e = err(json!({
        "modality": {"0": "CT"}, "labels": {"0": "bg"},
        "training": [{"image": "../x.nii.gz", "label": "labelsTr/x.nii.gz"}]
    }));
    assert!(
        e.contains("training[0] image \"../x.nii.gz\": climbs out"),
        "{e}"
    );
    let e = err(json!({
        "modality": {"0": "CT"}, "labels": {"0": "bg"},
        "training": ["imagesTr/x.nii.gz"]
    }));
    assert!(e.contains("training[0] has no \"image\""), "{e}");
    let e = err(json!({
        "modality": {"0": "CT"}, "channel_names": {"0": "MR"}, "labels": {"0": "bg"}
    }));
    assert!(e.contains("disagree"), "{e}");
}

#[test]
fn paths_endings_and_channel_suffixes() {
    assert_eq!(
        relative("./imagesTr/x.nii.gz").unwrap(),
        "imagesTr/x.nii.gz"
    );
    assert!(relative("/etc/x.nii").is_err());
    assert!(relative("a/../../x").is_err());
    assert!(relative("./").is_err());
    assert_eq!(
        split_ending("x_0001.nii.gz", None),
        Some(("x_0001", ".nii.gz"))
    );
    assert_eq!(split_ending("X.NII", None), Some(("X", ".NII")));
    assert_eq!(split_ending("x.nii.gz", Some(".nii")), None);
    assert_eq!(split_ending(".nii.gz", None), None);
    assert_eq!(cases::channel_of("la_003_0001"), Some(("la_003", 1)));
    assert_eq!(cases::channel_of("case_00000"), None);
    assert_eq!(cases::channel_of("_0001"), None);
}

//! An embedded 5x7 bitmap font for the PNG pictures prep draws (training curves, confusion
//! matrices, the labelled rows of `inspect --grid`): no font files or system dependencies.

use image::{Rgb, RgbImage};

pub type Color = [u8; 3];

/// The embedded 5x7 font: each entry is a character, '=', then its 7 rows top first as hex bytes
/// (bit 4 is the leftmost column). A string keeps the table compact; lookups are a short scan.
const FONT: &str = "\
    0=0e11131519110e 1=040c040404040e 2=0e11010204081f 3=1f02040201110e 4=02060a121f0202 \
    5=1f101e0101110e 6=0608101e11110e 7=1f010204080808 8=0e11110e11110e 9=0e11110f01020c \
    A=0e1111111f1111 B=1e11111e11111e C=0e11101010110e D=1c12111111121c E=1f10101e10101f \
    F=1f10101e101010 G=0e11101711110f H=1111111f111111 I=0e04040404040e J=0702020202120c \
    K=11121418141211 L=1010101010101f M=111b1515111111 N=11111915131111 O=0e11111111110e \
    P=1e11111e101010 Q=0e11111115120d R=1e11111e141211 S=0f10100e01011e T=1f040404040404 \
    U=1111111111110e V=11111111110a04 W=1111111515150a X=11110a040a1111 Y=1111110a040404 \
    Z=1f01020408101f a=00000e010f110f b=1010161911111e c=00000e1010110e d=01010d1311110f \
    e=00000e111f100e f=0609081c080808 g=000f11110f010e h=10101619111111 i=04000c0404040e \
    j=0200060202120c k=10101214181412 l=0c04040404040e m=00001a15151111 n=00001619111111 \
    o=00000e1111110e p=00001e111e1010 q=00000d130f0101 r=00001619101010 s=00000e100e011e \
    t=08081c08080906 u=0000111111130d v=00001111110a04 w=0000111115150a x=0000110a040a11 \
    y=000011110f010e z=00001f0204081f .=00000000000c0c ,=000000000c0408 :=000c0c000c0c00 \
    -=0000001f000000 _=0000000000001f %=18190204081303 (=02040808080402 )=08040202020408 \
    /=00010204081000 +=0004041f040400 ==00001f001f0000 ~=00000815020000";

/// Rows of the glyph for `c`; space is blank and characters outside the font draw as '?'.
pub fn glyph(c: char) -> [u8; 7] {
    if c == ' ' {
        return [0; 7];
    }
    let entry = FONT.split(' ').find(|e| e.starts_with(c));
    let hex = entry.map_or("0e110102040004", |e| &e[2..]);
    std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
}

/// Pixel width of `text` at `scale`: 5 columns plus a 1-column gap per glyph.
pub fn text_w(text: &str, scale: i64) -> i64 {
    (text.chars().count() as i64 * 6 - 1).max(0) * scale
}

/// Draws `text` with its top-left corner at (x, y). With `up` the text is turned a quarter turn
/// anticlockwise, reading bottom to top, and (x, y) is its bottom-left corner.
pub fn draw_text(
    img: &mut RgbImage,
    x: i64,
    y: i64,
    text: &str,
    scale: i64,
    color: Color,
    up: bool,
) {
    for (i, c) in text.chars().enumerate() {
        let off = i as i64 * 6;
        for (gy, bits) in glyph(c).iter().enumerate() {
            let gy = gy as i64;
            for gx in 0..5i64 {
                if (bits >> (4 - gx)) & 1 == 0 {
                    continue;
                }
                let (px, py) = if up {
                    (x + gy * scale, y - (off + gx + 1) * scale)
                } else {
                    (x + (off + gx) * scale, y + gy * scale)
                };
                fill_rect(img, px, py, scale, scale, color);
            }
        }
    }
}

/// Fills a rectangle, clipped to the image, so callers never index out of bounds.
pub fn fill_rect(img: &mut RgbImage, x: i64, y: i64, w: i64, h: i64, color: Color) {
    let (iw, ih) = (img.width() as i64, img.height() as i64);
    for py in y.max(0)..(y.saturating_add(h)).min(ih) {
        for px in x.max(0)..(x.saturating_add(w)).min(iw) {
            img.put_pixel(px as u32, py as u32, Rgb(color));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_font_table_is_well_formed() {
        // The font string is hand-written: every entry must be "c=" plus 14 hex digits, c unique.
        let entries: Vec<&str> = FONT.split(' ').collect();
        for e in &entries {
            let ok = e.len() == 16 && &e[1..2] == "=" && u64::from_str_radix(&e[2..], 16).is_ok();
            let same = entries.iter().filter(|o| o.starts_with(&e[..1])).count();
            assert!(ok && same == 1, "{e}");
        }
        assert_eq!(text_w("ab", 2), 22);
    }
}

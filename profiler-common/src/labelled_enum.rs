//! [`labelled_enum!`](macro@crate::labelled_enum): field-less enums whose variants each have a label,
//! with the lists and conversions every such enum here needs written once.

/// Declares a field-less enum whose variants each have a label (the name metrics, markers and
/// profiles show), with `COUNT`, `ALL` (declaration order) and `name()`.
///
/// With `: repr, from_fn` after the name, the enum is `#[repr(repr)]`, each variant has an
/// explicit value (what crosses the BPF boundary), and `from_fn(repr) -> Option<Self>` reads
/// one back: a plain `match`, fit for the BPF program.
///
/// ```
/// profiler_common::labelled_enum! {
///     /// What a light shows.
///     pub enum Light: u8, from_u8 {
///         /// Stop.
///         Red = 1 => "red",
///         Green = 2 => "green",
///     }
/// }
/// assert_eq!(Light::from_u8(2), Some(Light::Green));
/// assert_eq!(Light::ALL.map(Light::name), ["red", "green"]);
/// ```
#[macro_export]
macro_rules! labelled_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $repr:ident, $from:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $value:literal => $label:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant = $value,)+
        }

        impl $name {
            /// The variant whose value is `value`, if any.
            pub const fn $from(value: $repr) -> Option<Self> {
                match value {
                    $($value => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        $crate::labelled_enum!(@lists $name { $($variant => $label,)+ });
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident => $label:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        $crate::labelled_enum!(@lists $name { $($variant => $label,)+ });
    };
    (@lists $name:ident { $($variant:ident => $label:literal,)+ }) => {
        impl $name {
            /// How many variants there are.
            pub const COUNT: usize = [$($label),+].len();
            /// Every variant, in declaration order.
            pub const ALL: [Self; Self::COUNT] = [$(Self::$variant),+];

            /// Its label, for metrics, markers and profiles.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $label,)+
                }
            }

            /// The variant labelled `text` (a setting's value, for instance).
            pub fn from_name(text: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|variant| variant.name() == text)
            }
        }
    };
}

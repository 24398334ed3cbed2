#[derive(Debug, Clone, PartialEq)]
struct Temperature {
    celsius: f64,
}

impl Temperature {
    fn from_fahrenheit(f: f64) -> Self {
        Temperature { celsius: (f - 32.0) * 5.0 / 9.0 }
    }

    fn fahrenheit(&self) -> f64 {
        self.celsius * ‸
    }
}

module Stats where

mean :: [Double] -> Double
mean xs = sum xs / fromIntegral (length xs)

variance :: [Double] -> Double
variance xs = sum [(x - m) ^ 2 | x <- xs] / ‸
  where
    m = mean xs

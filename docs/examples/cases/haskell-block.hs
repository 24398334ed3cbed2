module Main where

import Data.List (sortBy)
import Data.Ord (comparing)

data Employee = Employee { name :: String, salary :: Int }

-- The n best-paid employees, highest first.
topEarners :: Int -> [Employee] -> [Employee]
topEarners n employees =
  ‸

main :: IO ()
main = mapM_ (putStrLn . name) (topEarners 2 [Employee "a" 10, Employee "b" 30, Employee "c" 20])

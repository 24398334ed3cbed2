let rec length = function
  | [] -> 0
  | _ :: rest -> 1 + ‸

let () = print_int (length [1; 2; 3])
